/* Avro EventBatch bodies read in C: the correlator's hot path (schemas/avro.py::decode).
 *
 * read(body) -> dict gives what fastavro.schemaless_reader(io.BytesIO(body), parsed) gives for
 * schemas/avro/EventBatch.avsc (fastavro 1.13.1, its compiled reader), and raises ValueError
 * wherever fastavro raises. Validation stays with pydantic. The body comes from a Kafka topic:
 * every read is bounds-checked, and nothing is allocated from a count or length before the
 * bytes it promises are there (a list grows one item at a time, each item at least a byte).
 *
 * fastavro's reader, matched here, including where it is lenient:
 * - a long is a zig-zag varint with no length limit: byte k (k >= 1) ORs its seven bits in at
 *   shift 7k taken modulo 64 (what the C shift in fastavro's read_long does on x86-64), so an
 *   overlong varint is accepted and wraps; a varint cut short is refused;
 * - a union index is a Python list index: -n..n-1 for n branches (-1 is the last branch);
 * - a boolean is any byte, true unless 0;
 * - a string length must be 0..bytes left; the bytes must be strict UTF-8;
 * - a block count < 0 is followed by a byte size, read and ignored, and abs(count) items;
 *   count INT64_MIN (which fastavro's negation leaves negative) holds no items, and the
 *   blocks go on;
 * - a map key repeated: the later value wins, at the first key's place (a dict);
 * - timestamp-micros: datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=v),
 *   refused outside years 1..9999 (fastavro's OverflowError);
 * - bytes after the record are ignored.
 *
 * FINGERPRINT is the CRC-64-AVRO fingerprint (little-endian) of the schema this reads;
 * avro.py uses this module only while it equals today's EventBatch.avsc fingerprint.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>
#include <stdint.h>
#include <string.h>

#include "_avro_time.h"

static const char FINGERPRINT[8] = {(char)0x86, (char)0x8c, 0x43, 0x3d, (char)0xfd, 0x0a, (char)0xd5, 0x68};

/* Field names of each record, in the schema's order (fastavro's dict order). */
enum { B_WORKLOAD, B_ATTEMPT, B_EVENTS, B_PATHS, B_METRIC_HOSTS, B_LINE_FILES, B_LINES, N_BATCH };
static const char *const BATCH_NAMES[N_BATCH] = {"workload_id", "attempt", "events", "paths", "metric_hosts",
                                                 "line_files", "lines"};

enum {
    E_KIND, E_PATTERN, E_SOURCE, E_HOST, E_GPU, E_RANK, E_STAMP, E_LAST_STAMP, E_ONSET, E_STAMP_QUALITY,
    E_FIELDS, E_REF, E_TEXT, E_COUNT, E_RANKS, E_SIGNATURE, N_EVENT
};
static const char *const EVENT_NAMES[N_EVENT] = {
    "kind", "pattern", "source", "host", "gpu", "rank", "stamp", "last_stamp", "onset", "stamp_quality",
    "fields", "ref", "text", "count", "ranks", "signature"};

enum { G_PCI, G_INDEX, N_GPU };
static const char *const GPU_NAMES[N_GPU] = {"pci", "index"};

enum { R_PATH, R_LINE, N_REF };
static const char *const REF_NAMES[N_REF] = {"path", "line"};

typedef struct {
    int ready;
    PyObject *batch_keys[N_BATCH], *event_keys[N_EVENT], *gpu_keys[N_GPU], *ref_keys[N_REF];
    PyObject *batch_template, *event_template, *gpu_template, *ref_template;   /* every key -> None */
} State;

static State S;

/* ---------------------------------------------------------------- wire format */

typedef struct {
    const unsigned char *start, *p, *end;
} Reader;

static int
refuse(const Reader *r, const char *what)
{
    PyErr_Format(PyExc_ValueError, "%s at byte %zd", what, (Py_ssize_t)(r->p - r->start));
    return -1;
}

/* A zig-zag varint long, read as fastavro reads it (see the top of this file). */
static int
read_long(Reader *r, int64_t *out)
{
    if (r->p >= r->end)
        return refuse(r, "truncated long");
    uint64_t b = *r->p++;
    uint64_t n = b & 0x7F;
    uint32_t shift = 7;
    while (b & 0x80) {
        if (r->p >= r->end)
            return refuse(r, "truncated long");
        b = *r->p++;
        n |= (b & 0x7F) << (shift & 63);
        shift += 7;
    }
    *out = (int64_t)((n >> 1) ^ (0 - (n & 1)));
    return 0;
}

/* A union's branch for n branches, Python-indexed as fastavro does: -n..n-1. */
static int
read_branch(Reader *r, int n, int *branch)
{
    int64_t i;
    if (read_long(r, &i) < 0)
        return -1;
    if (i < 0)
        i += n;
    if (i < 0 || i >= n)
        return refuse(r, "union index out of range");
    *branch = (int)i;
    return 0;
}

/* The last compact ASCII str of one field: batches repeat kinds, sources, hosts and keys,
 * so equal bytes reuse the (immutable, equal) str. */
typedef struct {
    PyObject *str;
} Cache;

/* A strict UTF-8 string. */
static PyObject *
read_string(Reader *r, Cache *c)
{
    int64_t n;
    if (read_long(r, &n) < 0)
        return NULL;
    if (n < 0 || n > r->end - r->p) {
        refuse(r, n < 0 ? "negative string length" : "string past the end");
        return NULL;
    }
    const unsigned char *s = r->p;
    if (c != NULL && c->str != NULL && PyUnicode_GET_LENGTH(c->str) == n
        && memcmp(PyUnicode_DATA(c->str), s, (size_t)n) == 0) {
        r->p += n;
        Py_INCREF(c->str);
        return c->str;
    }
    PyObject *o = PyUnicode_DecodeUTF8((const char *)s, (Py_ssize_t)n, NULL);
    if (o == NULL) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            refuse(r, "string that is not UTF-8");
        }
        return NULL;
    }
    r->p += n;
    if (c != NULL && PyUnicode_IS_COMPACT_ASCII(o)) {
        Py_INCREF(o);
        Py_XSETREF(c->str, o);
    }
    return o;
}

static PyObject *
read_long_obj(Reader *r)
{
    int64_t v;
    if (read_long(r, &v) < 0)
        return NULL;
    return PyLong_FromLongLong(v);
}

/* timestamp-micros: epoch + timedelta(microseconds=us), an aware UTC datetime. */
static PyObject *
read_timestamp(Reader *r)
{
    int64_t us;
    int out_of_range = 0;
    if (read_long(r, &us) < 0)
        return NULL;
    PyObject *o = utc_from_micros(us, &out_of_range);
    if (o == NULL && out_of_range)
        refuse(r, "timestamp out of range");
    return o;
}

/* ["null", T]: None or what read gives. */
typedef PyObject *(*ReadFn)(Reader *, Cache *);

static PyObject *
read_ts_fn(Reader *r, Cache *Py_UNUSED(c))
{
    return read_timestamp(r);
}

static PyObject *
read_long_fn(Reader *r, Cache *Py_UNUSED(c))
{
    return read_long_obj(r);
}

static PyObject *
read_optional(Reader *r, ReadFn read, Cache *c)
{
    int branch;
    if (read_branch(r, 2, &branch) < 0)
        return NULL;
    if (branch == 0)
        Py_RETURN_NONE;
    return read(r, c);
}

static PyObject *
read_double(Reader *r)
{
    if (r->end - r->p < 8) {
        refuse(r, "truncated double");
        return NULL;
    }
    uint64_t bits = 0;
    for (int i = 7; i >= 0; i--)
        bits = (bits << 8) | r->p[i];
    r->p += 8;
    double v;
    memcpy(&v, &bits, sizeof v);
    return PyFloat_FromDouble(v);
}

/* The next block's item count: 0 at the end. A negative count is followed by a byte size
 * (read, unused) and holds abs(count) items; INT64_MIN holds none but does not end the blocks. */
static int
read_block(Reader *r, int64_t *count, uint64_t *items)
{
    if (read_long(r, count) < 0)
        return -1;
    if (*count < 0) {
        int64_t size;
        if (read_long(r, &size) < 0)
            return -1;
        *items = *count == INT64_MIN ? 0 : (uint64_t)(-*count);
    }
    else
        *items = (uint64_t)*count;
    return 0;
}

/* An array of what read gives; every item takes at least a byte, so a huge count soon fails. */
static PyObject *
read_array(Reader *r, ReadFn read, Cache *c)
{
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return NULL;
    int64_t count;
    uint64_t items;
    for (;;) {
        if (read_block(r, &count, &items) < 0)
            goto fail;
        if (count == 0)
            return list;
        for (uint64_t i = 0; i < items; i++) {
            PyObject *item = read(r, c);
            if (item == NULL)
                goto fail;
            int rc = PyList_Append(list, item);
            Py_DECREF(item);
            if (rc < 0)
                goto fail;
        }
    }
fail:
    Py_DECREF(list);
    return NULL;
}

/* EventBatch.lines' items: an array of longs. */
static PyObject *
read_longs(Reader *r, Cache *Py_UNUSED(c))
{
    return read_array(r, read_long_fn, NULL);
}

/* Event.fields: map of ["null", "string", "long", "double", "boolean"]. */
static PyObject *
read_field_value(Reader *r, Cache *c)
{
    int branch;
    if (read_branch(r, 5, &branch) < 0)
        return NULL;
    switch (branch) {
    case 0:
        Py_RETURN_NONE;
    case 1:
        return read_string(r, c);
    case 2:
        return read_long_obj(r);
    case 3:
        return read_double(r);
    default:
        if (r->p >= r->end) {
            refuse(r, "truncated boolean");
            return NULL;
        }
        return PyBool_FromLong(*r->p++ != 0);
    }
}

static PyObject *
read_fields(Reader *r, Cache caches[2])
{
    PyObject *map = PyDict_New();
    if (map == NULL)
        return NULL;
    int64_t count;
    uint64_t items;
    for (;;) {
        if (read_block(r, &count, &items) < 0)
            goto fail;
        if (count == 0)
            return map;
        for (uint64_t i = 0; i < items; i++) {
            PyObject *key = read_string(r, &caches[0]);
            if (key == NULL)
                goto fail;
            PyObject *value = read_field_value(r, &caches[1]);
            if (value == NULL) {
                Py_DECREF(key);
                goto fail;
            }
            int rc = PyDict_SetItem(map, key, value);
            Py_DECREF(key);
            Py_DECREF(value);
            if (rc < 0)
                goto fail;
        }
    }
fail:
    Py_DECREF(map);
    return NULL;
}

/* Set one field of a record dict built from its template (a new reference, consumed). */
static int
put(PyObject *dict, PyObject *key, PyObject *value)
{
    if (value == NULL)
        return -1;
    int rc = PyDict_SetItem(dict, key, value);
    Py_DECREF(value);
    return rc;
}

static PyObject *
read_gpu(Reader *r, Cache *c)
{
    PyObject *d = PyDict_Copy(S.gpu_template);
    if (d == NULL)
        return NULL;
    if (put(d, S.gpu_keys[G_PCI], read_optional(r, read_string, c)) < 0
        || put(d, S.gpu_keys[G_INDEX], read_optional(r, read_long_fn, NULL)) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

static PyObject *
read_ref(Reader *r, Cache *c)
{
    PyObject *d = PyDict_Copy(S.ref_template);
    if (d == NULL)
        return NULL;
    if (put(d, S.ref_keys[R_PATH], read_string(r, c)) < 0 || put(d, S.ref_keys[R_LINE], read_long_obj(r)) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* Per-field string caches for one body's events. */
enum { C_KIND, C_PATTERN, C_SOURCE, C_HOST, C_PCI, C_QUALITY, C_KEY, C_VALUE, C_PATH, C_SIGNATURE, N_CACHE };

static PyObject *
read_event(Reader *r, Cache *caches)
{
    PyObject *d = PyDict_Copy(S.event_template);
    if (d == NULL)
        return NULL;
    PyObject *const *k = S.event_keys;
    if (put(d, k[E_KIND], read_string(r, &caches[C_KIND])) < 0
        || put(d, k[E_PATTERN], read_string(r, &caches[C_PATTERN])) < 0
        || put(d, k[E_SOURCE], read_string(r, &caches[C_SOURCE])) < 0
        || put(d, k[E_HOST], read_optional(r, read_string, &caches[C_HOST])) < 0
        || put(d, k[E_GPU], read_optional(r, read_gpu, &caches[C_PCI])) < 0
        || put(d, k[E_RANK], read_optional(r, read_long_fn, NULL)) < 0
        || put(d, k[E_STAMP], read_optional(r, read_ts_fn, NULL)) < 0
        || put(d, k[E_LAST_STAMP], read_optional(r, read_ts_fn, NULL)) < 0
        || put(d, k[E_ONSET], read_optional(r, read_ts_fn, NULL)) < 0
        || put(d, k[E_STAMP_QUALITY], read_string(r, &caches[C_QUALITY])) < 0
        || put(d, k[E_FIELDS], read_fields(r, &caches[C_KEY])) < 0
        || put(d, k[E_REF], read_ref(r, &caches[C_PATH])) < 0
        || put(d, k[E_TEXT], read_string(r, NULL)) < 0
        || put(d, k[E_COUNT], read_long_obj(r)) < 0
        || put(d, k[E_RANKS], read_array(r, read_long_fn, NULL)) < 0
        || put(d, k[E_SIGNATURE], read_string(r, &caches[C_SIGNATURE])) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

static PyObject *
read_batch(Reader *r)
{
    Cache caches[N_CACHE] = {{NULL}};
    Cache names = {NULL};
    PyObject *d = PyDict_Copy(S.batch_template);
    PyObject *const *k = S.batch_keys;
    if (d != NULL
        && (put(d, k[B_WORKLOAD], read_string(r, NULL)) < 0
            || put(d, k[B_ATTEMPT], read_long_obj(r)) < 0
            || put(d, k[B_EVENTS], read_array(r, read_event, caches)) < 0
            || put(d, k[B_PATHS], read_array(r, read_string, &names)) < 0
            || put(d, k[B_METRIC_HOSTS], read_array(r, read_string, &names)) < 0
            || put(d, k[B_LINE_FILES], read_array(r, read_string, NULL)) < 0
            || put(d, k[B_LINES], read_array(r, read_longs, NULL)) < 0))
        Py_CLEAR(d);
    for (int i = 0; i < N_CACHE; i++)
        Py_XDECREF(caches[i].str);
    Py_XDECREF(names.str);
    return d;
}

static PyObject *
eb_read(PyObject *Py_UNUSED(module), PyObject *body)
{
    Py_buffer view;
    if (PyObject_GetBuffer(body, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Reader r = {(const unsigned char *)view.buf, (const unsigned char *)view.buf,
                (const unsigned char *)view.buf + view.len};
    PyObject *out = read_batch(&r);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"read", (PyCFunction)eb_read, METH_O,
     "read(body) -> dict\n\n"
     "An EventBatch Avro body (after the 10-byte single-object head) -> the dict\n"
     "fastavro.schemaless_reader gives; ValueError where fastavro refuses it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "firstfault.schemas._eventbatch",
    "Avro EventBatch bodies read in C (see schemas/avro.py::decode).", -1, methods, NULL, NULL, NULL, NULL,
};

static void
clear_state(void)
{
    for (int i = 0; i < N_BATCH; i++)
        Py_CLEAR(S.batch_keys[i]);
    for (int i = 0; i < N_EVENT; i++)
        Py_CLEAR(S.event_keys[i]);
    for (int i = 0; i < N_GPU; i++)
        Py_CLEAR(S.gpu_keys[i]);
    for (int i = 0; i < N_REF; i++)
        Py_CLEAR(S.ref_keys[i]);
    Py_CLEAR(S.batch_template);
    Py_CLEAR(S.event_template);
    Py_CLEAR(S.gpu_template);
    Py_CLEAR(S.ref_template);
}

/* Interned keys and a template dict (every key -> None, in order) for one record. */
static int
record(const char *const *names, int n, PyObject **keys, PyObject **template)
{
    if ((*template = PyDict_New()) == NULL)
        return -1;
    for (int i = 0; i < n; i++) {
        if ((keys[i] = PyUnicode_InternFromString(names[i])) == NULL
            || PyDict_SetItem(*template, keys[i], Py_None) < 0)
            return -1;
    }
    return 0;
}

static int
init_state(void)
{
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == NULL)
        return -1;
    if (record(BATCH_NAMES, N_BATCH, S.batch_keys, &S.batch_template) < 0
        || record(EVENT_NAMES, N_EVENT, S.event_keys, &S.event_template) < 0
        || record(GPU_NAMES, N_GPU, S.gpu_keys, &S.gpu_template) < 0
        || record(REF_NAMES, N_REF, S.ref_keys, &S.ref_template) < 0)
        return -1;
    return 0;
}

PyMODINIT_FUNC
PyInit__eventbatch(void)
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
    PyObject *fp = PyBytes_FromStringAndSize(FINGERPRINT, sizeof FINGERPRINT);
    if (fp == NULL || PyModule_AddObject(m, "FINGERPRINT", fp) < 0) {
        Py_XDECREF(fp);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
