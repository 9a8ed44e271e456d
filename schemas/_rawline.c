/* Avro RawLine records decoded in C: the extractor's hot path (streams/codecs.py::raw_lines).
 *
 * decode_many(values, head, cls) -> (recs, texts) does per value exactly what the pure-Python
 * path does (schemas/avro_fast.py's generated decoder, then avro._construct): None in both lists
 * for anything it refuses (wrong head, truncated or trailing bytes, a union branch other than
 * 0 or 2, a negative or oversized length, a varint past 10 bytes or 64 bits, a string that is
 * not UTF-8, a timestamp outside datetime's years, line < 1, an empty path), else a RawLine built
 * without validation and the line's bytes. The values come from a Kafka topic: every read is
 * bounds-checked against the value's own length.
 *
 * PLAN is the field layout this decodes, in compile_flat's terms; codecs.py uses this module
 * only while PLAN matches schemas/avro/RawLine.avsc, so a schema change falls back to Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>
#include <stdint.h>
#include <string.h>

#include "_avro_time.h"


/* Field names, in the schema's order (also the order of the instance's __dict__). */
enum { F_HOST, F_PATH, F_LINE, F_TEXT, F_SOURCE, F_WORKLOAD, F_TS, N_FIELDS };
static const char *const FIELD_NAMES[N_FIELDS] = {
    "host", "path", "line", "text", "source", "workload_id", "ingest_ts"};
static const char *const FIELD_KINDS[N_FIELDS] = {
    "string", "string", "long", "bytes", "string", "string", "ts"};
static const int FIELD_NULLABLE[N_FIELDS] = {1, 0, 0, 0, 1, 1, 1};

typedef struct {
    int ready;
    PyObject *keys[N_FIELDS];      /* interned field names */
    PyObject *template_dict;       /* every field -> None: copied per record, no resizing */
    PyObject *fields_set;          /* frozenset of the names: each record gets a set of it */
    PyObject *empty_tuple;
    PyObject *s_dict, *s_fields_set, *s_extra, *s_private;
} State;

static State S;

/* ---------------------------------------------------------------- wire format */

typedef struct {
    const unsigned char *p;
    Py_ssize_t n;                  /* -1: null */
} Span;

typedef struct {
    Span host, path, text, source, workload;
    int64_t line;
    int has_ts;
    int64_t ts;
} Parsed;

typedef struct {
    const unsigned char *p, *end;
} Reader;

/* A zig-zag varint long; -1 when truncated, longer than 10 bytes or past 64 bits. */
static int
read_long(Reader *r, int64_t *out)
{
    uint64_t acc = 0;
    for (int i = 0; i < 10; i++) {
        if (r->p >= r->end)
            return -1;
        unsigned b = *r->p++;
        if (i == 9 && b > 1)       /* the tenth byte holds bit 63 only */
            return -1;
        acc |= (uint64_t)(b & 0x7F) << (7 * i);
        if (b < 0x80) {
            *out = (int64_t)(acc >> 1) ^ -(int64_t)(acc & 1);
            return 0;
        }
    }
    return -1;
}

/* A union's branch: one byte, 0 (null) or 2 (the value), as the Python decoder reads it.
 * Sets *present; -1 on anything else. */
static int
read_branch(Reader *r, int *present)
{
    if (r->p >= r->end)
        return -1;
    unsigned b = *r->p++;
    if (b != 0 && b != 2)
        return -1;
    *present = b == 2;
    return 0;
}

/* A length-prefixed string or bytes: the span stays inside the value. */
static int
read_span(Reader *r, Span *s)
{
    int64_t n;
    if (read_long(r, &n) < 0 || n < 0 || n > r->end - r->p)
        return -1;
    s->p = r->p;
    s->n = (Py_ssize_t)n;
    r->p += n;
    return 0;
}

static int
read_opt_span(Reader *r, Span *s)
{
    int present;
    if (read_branch(r, &present) < 0)
        return -1;
    if (!present) {
        s->p = NULL;
        s->n = -1;
        return 0;
    }
    return read_span(r, s);
}

/* The body after the head -> spans and numbers; -1 when the Python path would refuse it
 * (UTF-8 and the timestamp's range are checked while building the objects). */
static int
parse(const unsigned char *p, Py_ssize_t size, Parsed *out)
{
    Reader r = {p, p + size};
    int present;
    if (read_opt_span(&r, &out->host) < 0 || read_span(&r, &out->path) < 0
        || read_long(&r, &out->line) < 0 || read_span(&r, &out->text) < 0
        || read_opt_span(&r, &out->source) < 0 || read_opt_span(&r, &out->workload) < 0
        || read_branch(&r, &present) < 0)
        return -1;
    out->has_ts = present;
    if (present && read_long(&r, &out->ts) < 0)
        return -1;
    if (r.p != r.end || out->line < 1 || out->path.n == 0)
        return -1;
    return 0;
}

/* ---------------------------------------------------------------- objects */

/* The last ASCII string decoded for one field: a batch's records mostly share host and path,
 * so equal bytes reuse the str (immutable, equal to what a fresh decode gives). */
typedef struct {
    PyObject *str;
} Cache;

/* A strict UTF-8 str for a span, None for null; NULL with *refused set when it is not UTF-8,
 * NULL without it on a real error. */
static PyObject *
string(Cache *c, Span s, int *refused)
{
    if (s.n < 0)
        Py_RETURN_NONE;
    if (c->str != NULL && PyUnicode_GET_LENGTH(c->str) == s.n
        && memcmp(PyUnicode_DATA(c->str), s.p, (size_t)s.n) == 0) {
        Py_INCREF(c->str);
        return c->str;
    }
    PyObject *o = PyUnicode_DecodeUTF8((const char *)s.p, s.n, NULL);
    if (o == NULL) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            *refused = 1;
        }
        return NULL;
    }
    /* Only a compact ASCII str holds exactly the bytes it came from. */
    Py_CLEAR(c->str);
    if (PyUnicode_IS_COMPACT_ASCII(o)) {
        Py_INCREF(o);
        c->str = o;
    }
    return o;
}

/* avro._construct: cls.__new__(cls), then __dict__ and pydantic's three slots set generically. */
static PyObject *
construct(PyTypeObject *cls, PyObject *values)
{
    PyObject *obj = cls->tp_new(cls, S.empty_tuple, NULL);
    if (obj == NULL)
        return NULL;
    PyObject *fields_set = PySet_New(S.fields_set);
    if (fields_set == NULL
        || PyObject_GenericSetAttr(obj, S.s_dict, values) < 0
        || PyObject_GenericSetAttr(obj, S.s_fields_set, fields_set) < 0
        || PyObject_GenericSetAttr(obj, S.s_extra, Py_None) < 0
        || PyObject_GenericSetAttr(obj, S.s_private, Py_None) < 0) {
        Py_XDECREF(fields_set);
        Py_DECREF(obj);
        return NULL;
    }
    Py_DECREF(fields_set);
    return obj;
}

/* Field values of a parsed record; 0 built, 1 refused (bad UTF-8, timestamp out of range),
 * -1 error. On anything but 0 nothing is left in vals. */
static int
build_values(const Parsed *r, Cache caches[N_FIELDS], PyObject *vals[N_FIELDS])
{
    int refused = 0;
    memset(vals, 0, sizeof(PyObject *) * N_FIELDS);
    if ((vals[F_HOST] = string(&caches[F_HOST], r->host, &refused)) == NULL
        || (vals[F_PATH] = string(&caches[F_PATH], r->path, &refused)) == NULL
        || (vals[F_SOURCE] = string(&caches[F_SOURCE], r->source, &refused)) == NULL
        || (vals[F_WORKLOAD] = string(&caches[F_WORKLOAD], r->workload, &refused)) == NULL)
        goto fail;
    if (r->has_ts) {
        if ((vals[F_TS] = utc_from_micros(r->ts, &refused)) == NULL)
            goto fail;
    }
    else {
        Py_INCREF(Py_None);
        vals[F_TS] = Py_None;
    }
    if ((vals[F_LINE] = PyLong_FromLongLong(r->line)) == NULL
        || (vals[F_TEXT] = PyUnicode_DecodeUTF8((const char *)r->text.p, r->text.n, "surrogateescape")) == NULL)
        goto fail;
    return 0;
fail:
    for (int i = 0; i < N_FIELDS; i++)
        Py_CLEAR(vals[i]);
    return refused ? 1 : -1;
}

/* One value -> (*rec, *text) new references, both None when refused; -1 on error. */
static int
decode_one(PyObject *value, const char *head, Py_ssize_t head_len, PyTypeObject *cls,
           Cache caches[N_FIELDS], PyObject **rec, PyObject **text)
{
    *rec = *text = NULL;
    if (value == Py_None)
        goto refuse;
    if (!PyBytes_Check(value)) {
        PyErr_Format(PyExc_TypeError, "a raw value must be bytes or None, not %.100s", Py_TYPE(value)->tp_name);
        return -1;
    }
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(value);
    Py_ssize_t size = PyBytes_GET_SIZE(value);
    Parsed r;
    if (size < head_len || memcmp(data, head, (size_t)head_len) != 0
        || parse(data + head_len, size - head_len, &r) < 0)
        goto refuse;
    PyObject *vals[N_FIELDS];
    int built = build_values(&r, caches, vals);
    if (built == 1)
        goto refuse;
    if (built < 0)
        return -1;
    PyObject *dict = PyDict_Copy(S.template_dict);
    int ok = dict != NULL;
    for (int i = 0; i < N_FIELDS; i++) {
        if (ok && vals[i] != Py_None && PyDict_SetItem(dict, S.keys[i], vals[i]) < 0)
            ok = 0;
        Py_DECREF(vals[i]);
    }
    if (ok)
        *rec = construct(cls, dict);
    Py_XDECREF(dict);
    if (*rec == NULL)
        return -1;
    if ((*text = PyBytes_FromStringAndSize((const char *)r.text.p, r.text.n)) == NULL) {
        Py_CLEAR(*rec);
        return -1;
    }
    return 0;
refuse:
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    *rec = *text = Py_None;
    return 0;
}

static PyObject *
decode_many(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "decode_many(values, head, cls) takes 3 arguments");
        return NULL;
    }
    PyObject *head = args[1], *cls = args[2];
    if (!PyBytes_Check(head)) {
        PyErr_SetString(PyExc_TypeError, "head must be bytes");
        return NULL;
    }
    if (!PyType_Check(cls) || ((PyTypeObject *)cls)->tp_new == NULL) {
        PyErr_SetString(PyExc_TypeError, "cls must be a type that can be instantiated");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "values must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *recs = PyList_New(n), *texts = PyList_New(n), *out = NULL;
    Cache caches[N_FIELDS] = {{NULL}};
    if (recs == NULL || texts == NULL)
        goto done;
    /* A list may be changed by code a decref runs: index it afresh, never past its size. */
    for (Py_ssize_t i = 0; i < n && i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *value = PySequence_Fast_GET_ITEM(seq, i), *rec, *text;
        Py_INCREF(value);
        int rc = decode_one(value, PyBytes_AS_STRING(head), PyBytes_GET_SIZE(head), (PyTypeObject *)cls,
                            caches, &rec, &text);
        Py_DECREF(value);
        if (rc < 0)
            goto done;
        PyList_SET_ITEM(recs, i, rec);
        PyList_SET_ITEM(texts, i, text);
    }
    if (PySequence_Fast_GET_SIZE(seq) < n) {
        PyErr_SetString(PyExc_RuntimeError, "values changed size during decoding");
        goto done;
    }
    out = PyTuple_Pack(2, recs, texts);
done:
    for (int i = 0; i < N_FIELDS; i++)
        Py_XDECREF(caches[i].str);
    Py_XDECREF(recs);               /* unfilled slots are NULL: list dealloc skips them */
    Py_XDECREF(texts);
    Py_DECREF(seq);
    return out;
}

static PyMethodDef methods[] = {
    {"decode_many", (PyCFunction)(void (*)(void))decode_many, METH_FASTCALL,
     "decode_many(values, head, cls) -> (recs, texts)\n\n"
     "Single-object-encoded RawLine values (bytes or None) starting with head -> cls instances\n"
     "built without validation and each line's bytes; None in both where one is refused."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "firstfault.schemas._rawline",
    "Avro RawLine records decoded in C (see streams/codecs.py::raw_lines).", -1, methods, NULL, NULL, NULL, NULL,
};

static PyObject *
plan(void)
{
    PyObject *out = PyTuple_New(N_FIELDS);
    for (int i = 0; out != NULL && i < N_FIELDS; i++) {
        PyObject *entry = Py_BuildValue("(ssO)", FIELD_NAMES[i], FIELD_KINDS[i],
                                        FIELD_NULLABLE[i] ? Py_True : Py_False);
        if (entry == NULL)
            Py_CLEAR(out);
        else
            PyTuple_SET_ITEM(out, i, entry);
    }
    return out;
}

static void
clear_state(void)
{
    for (int i = 0; i < N_FIELDS; i++)
        Py_CLEAR(S.keys[i]);
    Py_CLEAR(S.template_dict);
    Py_CLEAR(S.fields_set);
    Py_CLEAR(S.empty_tuple);
    Py_CLEAR(S.s_dict);
    Py_CLEAR(S.s_fields_set);
    Py_CLEAR(S.s_extra);
    Py_CLEAR(S.s_private);
}

static int
init_state(void)
{
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == NULL)
        return -1;
    if ((S.template_dict = PyDict_New()) == NULL || (S.empty_tuple = PyTuple_New(0)) == NULL
        || (S.s_dict = PyUnicode_InternFromString("__dict__")) == NULL
        || (S.s_fields_set = PyUnicode_InternFromString("__pydantic_fields_set__")) == NULL
        || (S.s_extra = PyUnicode_InternFromString("__pydantic_extra__")) == NULL
        || (S.s_private = PyUnicode_InternFromString("__pydantic_private__")) == NULL)
        return -1;
    for (int i = 0; i < N_FIELDS; i++) {
        if ((S.keys[i] = PyUnicode_InternFromString(FIELD_NAMES[i])) == NULL
            || PyDict_SetItem(S.template_dict, S.keys[i], Py_None) < 0)
            return -1;
    }
    return (S.fields_set = PyFrozenSet_New(S.template_dict)) == NULL ? -1 : 0;
}

PyMODINIT_FUNC
PyInit__rawline(void)
{
    if (!S.ready) {
        if (init_state() < 0) {
            clear_state();
            return NULL;
        }
        S.ready = 1;
    }
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    PyObject *p = plan();
    if (p == NULL || PyModule_AddObject(m, "PLAN", p) < 0) {
        Py_XDECREF(p);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
