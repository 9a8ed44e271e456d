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
#include <structmember.h>
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

/* Does the byte b follow the byte a somewhere in the n bytes at z? */
static int
follows(const unsigned char *z, Py_ssize_t n, unsigned char a, unsigned char b)
{
    const unsigned char *end = z + n;
    const unsigned char *q = n > 1 ? memchr(z + 1, b, (size_t)(n - 1)) : NULL;
    while (q != NULL) {
        if (q[-1] == a)
            return 1;
        q = q + 1 < end ? memchr(q + 1, b, (size_t)(end - q - 1)) : NULL;
    }
    return 0;
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
    for (Py_ssize_t i = 0; i < n; i++) {       /* branch-free: the compiler vectorizes it */
        unsigned char c = src[i];
        z[i] = (unsigned char)(c - '0') <= 9 ? '0' : c;
    }
    /* "0x" (a digit, then x) and "%|" are rare: memchr finds each x or | there is */
    if (!follows(z, n, '0', 'x') || follows(z, n, '%', '|')) {
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

/* A slotted dataclass's instance (prefixes.Head) from its fields' values in order, without running its
 * __init__ (Python code a line): the values go straight into the slots, as __init__'s assignments put
 * them. The type's layout is learnt once (its __slots__ in field order, each a T_OBJECT_EX member);
 * NULL without an error when the type is not such a class (the caller calls the type then). */
static PyObject *layout_type = NULL;             /* the type whose offsets are known (a strong reference) */
static Py_ssize_t layout_offsets[16];
static Py_ssize_t layout_count = -1;             /* -1: not such a class */

static int
learn_layout(PyObject *type_obj)
{
    PyTypeObject *type = (PyTypeObject *)type_obj;
    Py_XDECREF(layout_type);
    Py_INCREF(type_obj);
    layout_type = type_obj;
    layout_count = -1;
    if (!PyType_Check(type_obj) || !(type->tp_flags & Py_TPFLAGS_HEAPTYPE) || type->tp_members == NULL
            || type->tp_dictoffset != 0 || type->tp_base != &PyBaseObject_Type)
        return 0;
    PyObject *slots = PyObject_GetAttrString(type_obj, "__slots__");
    if (slots == NULL) {
        PyErr_Clear();
        return 0;
    }
    Py_ssize_t n = PyTuple_Check(slots) ? PyTuple_GET_SIZE(slots) : -1;
    int ok = n > 0 && n <= 16;
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(slots, i);
        const char *utf8 = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
        if (utf8 == NULL) {
            PyErr_Clear();
            ok = 0;
            break;
        }
        ok = 0;
        for (PyMemberDef *m = type->tp_members; m->name != NULL; m++) {
            if (strcmp(m->name, utf8) == 0 && m->type == T_OBJECT_EX && !(m->flags & READONLY)) {
                layout_offsets[i] = m->offset;
                ok = 1;
                break;
            }
        }
    }
    Py_DECREF(slots);
    if (ok)
        layout_count = n;
    return 0;
}

static PyObject *
build_slotted(PyObject *type_obj, PyObject *const *values, Py_ssize_t n)
{
    if (type_obj != layout_type)
        learn_layout(type_obj);
    if (layout_count != n)
        return NULL;
    PyTypeObject *type = (PyTypeObject *)type_obj;
    PyObject *obj = type->tp_alloc(type, 0);
    if (obj == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject **slot = (PyObject **)((char *)obj + layout_offsets[i]);
        Py_INCREF(values[i]);
        Py_XSETREF(*slot, values[i]);
    }
    return obj;
}

/* The Head a remembered prefix gives ``line`` under this very ctx (head_type(message, *seen[1:])), and
 * in *cut_out where its message starts; found is chains[key], (chain, heads). NULL without an error
 * when the chain must be replayed or the line read; NULL with one on an error. */
static PyObject *
remembered_head(PyObject *line, PyObject *ctx, PyObject *found, PyObject *head_type, Py_ssize_t n,
                Py_ssize_t *cut_out)
{
    PyObject *chain, *heads;
    Py_ssize_t clen;
    if (!PyTuple_Check(found) || PyTuple_GET_SIZE(found) != 2)
        return NULL;
    chain = PyTuple_GET_ITEM(found, 0);
    heads = PyTuple_GET_ITEM(found, 1);
    if (!PyTuple_Check(chain) || (clen = PyTuple_GET_SIZE(chain)) < 1 || !PyDict_Check(heads))
        return NULL;
    Py_ssize_t cut = PyLong_AsSsize_t(PyTuple_GET_ITEM(chain, clen - 1));
    if (cut == -1 && PyErr_Occurred())
        return NULL;
    if (cut < 0 || cut > n)
        return NULL;
    PyObject *prefix = PyUnicode_Substring(line, 0, cut);
    if (prefix == NULL)
        return NULL;
    PyObject *seen = PyDict_GetItemWithError(heads, prefix);    /* borrowed */
    Py_DECREF(prefix);
    if (seen == NULL)
        return NULL;                            /* not remembered, or an error the caller sees */
    Py_ssize_t k;
    if (!PyTuple_Check(seen) || (k = PyTuple_GET_SIZE(seen)) < 1 || k > 16 || PyTuple_GET_ITEM(seen, 0) != ctx)
        return NULL;
    Py_INCREF(seen);                            /* its items are the call's arguments */
    PyObject *call[16];
    PyObject *message = PyUnicode_Substring(line, cut, n);
    if (message == NULL) {
        Py_DECREF(seen);
        return NULL;
    }
    call[0] = message;
    for (Py_ssize_t i = 1; i < k; i++)
        call[i] = PyTuple_GET_ITEM(seen, i);
    PyObject *made = build_slotted(head_type, call, k);
    if (made == NULL && !PyErr_Occurred())
        made = PyObject_Vectorcall(head_type, call, (size_t)k, NULL);
    Py_DECREF(message);
    Py_DECREF(seen);
    *cut_out = cut;
    return made;
}

/* head_hit(line, ctx, chains, head_type, max_len) -> None | (head, mdata, mzeroed)
 *                                                   | (None, data, zeroed, key, known)
 *
 * read_head_keyed's memo, for a line of ASCII without terminal colours and at most max_len long (None
 * for any other line: the Python path reads it). A remembered prefix (a head for it under this very
 * ctx): the Head (head_type(message, *seen[1:])), the message's bytes and those with their digits as
 * '0' (the tail of line_keys' zeroed). Otherwise: the line's bytes, its keys (line_keys) and
 * chains[key] or None, for the chain to be replayed or the line read. */
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
    if (memchr(c, 0x1b, (size_t)n) != NULL)
        Py_RETURN_NONE;                         /* colours: plain() first, in Python */
    for (const unsigned char *q = memchr(c, '[', (size_t)n); q != NULL;
         q = q + 1 < c + n ? memchr(q + 1, '[', (size_t)(c + n - q - 1)) : NULL) {
        if (q + 2 < c + n && q[1] == '0' && q[2] == 'm')
            Py_RETURN_NONE;                     /* a reset "[0m" whose ESC was lost: plain() too */
    }
    PyObject *zeroed, *key, *data, *out = NULL;
    if (make_keys(c, n, &zeroed, &key) < 0)
        return NULL;
    PyObject *found = PyDict_GetItemWithError(chains, key);      /* borrowed */
    if (found == NULL && PyErr_Occurred())
        goto done;
    Py_XINCREF(found);                          /* owned from here: calling head_type runs Python code */
    if (found != NULL) {
        Py_ssize_t cut = 0;
        PyObject *head = remembered_head(line, ctx, found, head_type, n, &cut);
        if (head == NULL && PyErr_Occurred())
            goto done_found;
        if (head != NULL) {
            PyObject *mdata = PyBytes_FromStringAndSize((const char *)c + cut, n - cut);
            PyObject *mzeroed = NULL;
            if (mdata != NULL) {
                if (cut == 0) {
                    mzeroed = zeroed;
                    Py_INCREF(mzeroed);
                }
                else
                    mzeroed = PyBytes_FromStringAndSize(PyBytes_AS_STRING(zeroed) + cut, n - cut);
            }
            if (mzeroed != NULL)
                out = PyTuple_Pack(3, head, mdata, mzeroed);
            Py_DECREF(head);
            Py_XDECREF(mdata);
            Py_XDECREF(mzeroed);
            goto done_found;
        }
    }
    data = PyBytes_FromStringAndSize((const char *)c, n);
    if (data != NULL) {
        out = PyTuple_Pack(5, Py_None, data, zeroed, key, found != NULL ? found : Py_None);
        Py_DECREF(data);
    }
done_found:
    Py_XDECREF(found);
done:
    Py_DECREF(zeroed);
    Py_DECREF(key);
    return out;
}

/* newlines(data, start, end) -> data.count(b"\n", start, end): where a block's lines start and how many
 * it holds (rules/extract.py). bytes.count tests byte by byte; this loop the compiler vectorizes. */
static PyObject *
newlines(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "newlines(data, start, end) takes bytes and two ints");
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    if (end == -1 && PyErr_Occurred())
        return NULL;
    /* as a slice reads them (bytes.count's own adjustment) */
    if (end > n)
        end = n;
    else if (end < 0 && (end += n) < 0)
        end = 0;
    if (start < 0 && (start += n) < 0)
        start = 0;
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t count = 0;
    /* 16 byte-wide counters, summed every 255 rounds before one can overflow: the compiler makes each
     * round one vector compare and subtract */
    while (end - start >= 16) {
        unsigned char lanes[16] = {0};
        Py_ssize_t rounds = (end - start) / 16;
        if (rounds > 255)
            rounds = 255;
        for (Py_ssize_t r = 0; r < rounds; r++, start += 16) {
            for (int j = 0; j < 16; j++)
                lanes[j] += p[start + j] == '\n';
        }
        for (int j = 0; j < 16; j++)
            count += lanes[j];
    }
    for (; start < end; start++)
        count += p[start] == '\n';
    return PyLong_FromSsize_t(count);
}

/* group_bytes(data, spans, indices) -> tuple: for each index i of ``indices``, data[s:e] where (s, e) is
 * spans[i], or None where s < 0 (an unset group). The key rules/extract.py's event memo reads a match's
 * looked-up groups by (_Plan.looked_at): the bytes of the groups a line's lookups read. Slices as Python's
 * do (PySlice_AdjustIndices). */
static PyObject *
group_bytes(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyBytes_Check(args[0]) || !(PyList_Check(args[1]) || PyTuple_Check(args[1]))
            || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "group_bytes(data: bytes, spans: list | tuple, indices: tuple)");
        return NULL;
    }
    PyObject *data = args[0], *spans = args[1], *indices = args[2];
    Py_ssize_t len = PyBytes_GET_SIZE(data);
    Py_ssize_t count = PyTuple_GET_SIZE(indices);
    Py_ssize_t nspans = PySequence_Fast_GET_SIZE(spans);
    PyObject **items = PySequence_Fast_ITEMS(spans);
    PyObject *out = PyTuple_New(count);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < count; k++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(indices, k));
        if (i == -1 && PyErr_Occurred())
            goto fail;
        if (i < 0)
            i += nspans;
        if (i < 0 || i >= nspans) {
            PyErr_SetString(PyExc_IndexError, "group_bytes: index out of range");
            goto fail;
        }
        PyObject *span = items[i];
        if (!PyTuple_Check(span) || PyTuple_GET_SIZE(span) != 2) {
            PyErr_SetString(PyExc_TypeError, "group_bytes: a span is a (start, end) tuple");
            goto fail;
        }
        Py_ssize_t s = PyLong_AsSsize_t(PyTuple_GET_ITEM(span, 0));
        if (s == -1 && PyErr_Occurred())
            goto fail;
        PyObject *value;
        if (s < 0) {
            value = Py_None;
            Py_INCREF(value);
        }
        else {
            Py_ssize_t e = PyLong_AsSsize_t(PyTuple_GET_ITEM(span, 1));
            if (e == -1 && PyErr_Occurred())
                goto fail;
            Py_ssize_t size = PySlice_AdjustIndices(len, &s, &e, 1);     /* 0 where e <= s */
            value = PyBytes_FromStringAndSize(PyBytes_AS_STRING(data) + s, size);
            if (value == NULL)
                goto fail;
        }
        PyTuple_SET_ITEM(out, k, value);
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"line_keys", line_keys, METH_O,
     "line_keys(data) -> (zeroed, key): data with its digits as '0', and that with its pointers' hex\n"
     "letters as '0' too (the same object when there are none)."},
    {"head_hit", (PyCFunction)(void (*)(void))head_hit, METH_FASTCALL,
     "head_hit(line, ctx, chains, head_type, max_len) -> None | (head, mdata, mzeroed) | (None, data,\n"
     "zeroed, key, known): the remembered head of a plain ASCII line and its message's keys, else its\n"
     "keys (see rules/prefixes.py read_head_keyed)."},
    {"group_bytes", (PyCFunction)(void (*)(void))group_bytes, METH_FASTCALL,
     "group_bytes(data, spans, indices) -> tuple: data[s:e] for each spans[i] = (s, e) of the indices,\n"
     "None where s < 0 (see rules/extract.py _group_bytes)."},
    {"newlines", (PyCFunction)(void (*)(void))newlines, METH_FASTCALL,
     "newlines(data, start, end) -> data.count(b\"\\n\", start, end)."},
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
