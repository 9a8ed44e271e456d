/* The keys a line is remembered by (rules/prefixes.py read_head_keyed), made in one pass, and the
 * head a remembered prefix gives (head_hit).
 *
 * line_keys(data) -> (zeroed, key)
 *   zeroed: data with every ASCII digit as '0' (bytes.translate with prefixes._ZEROS);
 *   key:    zeroed with each pointer's hex letters as '0' too (prefixes._pointer_blind), or
 *           zeroed itself when no pointer is blinded.
 *
 * A pointer is what prefixes._POINTER matches on the zeroed bytes, left to right without overlap:
 * (?<![0-9A-Za-z_])0x[0-9a-f]+(?![0-9A-Za-z_]). A line holding "%|" (a progress bar) keeps its
 * letters. tests/test_prefixes.py checks this against the pure-Python functions it stands in for.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static int
is_word(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}

static int
is_hex_low(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

/* (zeroed, key) of the n bytes at src, as new references in *zeroed_out and *key_out (the same
 * object twice when no pointer is blinded); -1 on a memory error. */
static int
make_keys(const unsigned char *src, Py_ssize_t n, PyObject **zeroed_out, PyObject **key_out)
{
    PyObject *zeroed = PyBytes_FromStringAndSize(NULL, n);
    if (zeroed == NULL)
        return -1;
    unsigned char *z = (unsigned char *)PyBytes_AS_STRING(zeroed);
    int has_0x = 0, has_bar = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = src[i];
        if (c >= '0' && c <= '9')
            c = '0';
        z[i] = c;
        if (c == 'x' && i > 0 && z[i - 1] == '0')
            has_0x = 1;
        else if (c == '|' && i > 0 && z[i - 1] == '%')
            has_bar = 1;
    }
    if (!has_0x || has_bar) {
        Py_INCREF(zeroed);
        *zeroed_out = zeroed;
        *key_out = zeroed;
        return 0;
    }

    /* Blind the pointers into a copy, only if one is found. */
    PyObject *key = NULL;
    unsigned char *k = NULL;
    Py_ssize_t i = 0;
    while (i + 2 < n) {
        if (z[i] == '0' && z[i + 1] == 'x' && (i == 0 || !is_word(z[i - 1]))) {
            Py_ssize_t j = i + 2;
            while (j < n && is_hex_low(z[j]))
                j++;
            if (j > i + 2 && (j == n || !is_word(z[j]))) {
                if (key == NULL) {
                    key = PyBytes_FromStringAndSize((const char *)z, n);
                    if (key == NULL) {
                        Py_DECREF(zeroed);
                        return -1;
                    }
                    k = (unsigned char *)PyBytes_AS_STRING(key);
                }
                memset(k + i + 2, '0', (size_t)(j - i - 2));
                i = j;
                continue;
            }
        }
        i++;
    }
    if (key == NULL) {
        Py_INCREF(zeroed);
        key = zeroed;
    }
    *zeroed_out = zeroed;
    *key_out = key;
    return 0;
}

static PyObject *
line_keys(PyObject *self, PyObject *arg)
{
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "line_keys() takes bytes");
        return NULL;
    }
    PyObject *zeroed, *key;
    if (make_keys((const unsigned char *)PyBytes_AS_STRING(arg), PyBytes_GET_SIZE(arg), &zeroed, &key) < 0)
        return NULL;
    PyObject *out = PyTuple_Pack(2, zeroed, key);
    Py_DECREF(zeroed);
    Py_DECREF(key);
    return out;
}

/* head_hit(line, ctx, chains, head_type, max_len) -> None | (head, data, zeroed, key, known)
 *
 * read_head_keyed's memo, for a line of ASCII without terminal colours and at most max_len long (None
 * for any other line: the Python path reads it). data is the line's bytes, zeroed and key its keys
 * (line_keys), known chains[key] or None; head is the Head a remembered prefix gives under this very
 * ctx (head_type(message, *seen[1:])), or None when the chain must be replayed or the line read. */
static PyObject *
head_hit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyUnicode_Check(args[0]) || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "head_hit(line, ctx, chains, head_type, max_len)");
        return NULL;
    }
    PyObject *line = args[0], *ctx = args[1], *chains = args[2], *head_type = args[3];
    Py_ssize_t max_len = PyLong_AsSsize_t(args[4]);
    if (max_len == -1 && PyErr_Occurred())
        return NULL;
    if (!PyUnicode_IS_ASCII(line))
        Py_RETURN_NONE;
    Py_ssize_t n = PyUnicode_GET_LENGTH(line);
    if (n > max_len)
        Py_RETURN_NONE;
    const unsigned char *c = (const unsigned char *)PyUnicode_1BYTE_DATA(line);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (c[i] == 0x1b || (c[i] == '[' && i + 2 < n && c[i + 1] == '0' && c[i + 2] == 'm'))
            Py_RETURN_NONE;                     /* colours: plain() first, in Python */
    }
    PyObject *data = PyBytes_FromStringAndSize((const char *)c, n);
    if (data == NULL)
        return NULL;
    PyObject *zeroed, *key;
    if (make_keys(c, n, &zeroed, &key) < 0) {
        Py_DECREF(data);
        return NULL;
    }
    PyObject *head = Py_None, *known = Py_None;         /* owned: each goes into the result or is dropped */
    Py_INCREF(head);
    Py_INCREF(known);
    PyObject *found = PyDict_GetItemWithError(chains, key);      /* borrowed */
    if (found == NULL && PyErr_Occurred())
        goto fail;
    if (found != NULL) {
        Py_DECREF(known);
        known = found;
        Py_INCREF(known);
        PyObject *chain, *heads, *cut_obj;
        Py_ssize_t cut, clen;
        if (!PyTuple_Check(found) || PyTuple_GET_SIZE(found) != 2)
            goto done;
        chain = PyTuple_GET_ITEM(found, 0);
        heads = PyTuple_GET_ITEM(found, 1);
        if (!PyTuple_Check(chain) || (clen = PyTuple_GET_SIZE(chain)) < 1 || !PyDict_Check(heads))
            goto done;
        cut_obj = PyTuple_GET_ITEM(chain, clen - 1);
        cut = PyLong_AsSsize_t(cut_obj);
        if (cut == -1 && PyErr_Occurred())
            goto fail;
        if (cut < 0 || cut > n)
            goto done;
        PyObject *prefix = PyUnicode_Substring(line, 0, cut);
        if (prefix == NULL)
            goto fail;
        PyObject *seen = PyDict_GetItemWithError(heads, prefix);  /* borrowed */
        Py_DECREF(prefix);
        if (seen == NULL) {
            if (PyErr_Occurred())
                goto fail;
            goto done;
        }
        if (!PyTuple_Check(seen) || PyTuple_GET_SIZE(seen) < 1 || PyTuple_GET_ITEM(seen, 0) != ctx)
            goto done;
        Py_ssize_t k = PyTuple_GET_SIZE(seen);
        PyObject *call[16];
        if (k > 16)
            goto done;
        PyObject *message = PyUnicode_Substring(line, cut, n);
        if (message == NULL)
            goto fail;
        call[0] = message;
        for (Py_ssize_t i = 1; i < k; i++)
            call[i] = PyTuple_GET_ITEM(seen, i);
        PyObject *made = PyObject_Vectorcall(head_type, call, (size_t)k, NULL);
        Py_DECREF(message);
        if (made == NULL)
            goto fail;
        Py_DECREF(head);
        head = made;
    }
done:;
    PyObject *out = PyTuple_New(5);
    if (out == NULL)
        goto fail;
    PyTuple_SET_ITEM(out, 0, head);
    PyTuple_SET_ITEM(out, 1, data);
    PyTuple_SET_ITEM(out, 2, zeroed);
    PyTuple_SET_ITEM(out, 3, key);
    PyTuple_SET_ITEM(out, 4, known);
    return out;
fail:
    Py_DECREF(head);
    Py_DECREF(known);
    Py_DECREF(data);
    Py_DECREF(zeroed);
    Py_DECREF(key);
    return NULL;
}

static PyMethodDef methods[] = {
    {"line_keys", line_keys, METH_O,
     "line_keys(data) -> (zeroed, key): data with its digits as '0', and that with its pointers' hex\n"
     "letters as '0' too (the same object when there are none)."},
    {"head_hit", (PyCFunction)(void (*)(void))head_hit, METH_FASTCALL,
     "head_hit(line, ctx, chains, head_type, max_len) -> None | (head, data, zeroed, key, known): the\n"
     "remembered head of a plain ASCII line (see rules/prefixes.py read_head_keyed)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "firstfault.rules._linekey",
    "A line's memo keys in one pass (see rules/prefixes.py read_head_keyed).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__linekey(void)
{
    return PyModule_Create(&moduledef);
}
