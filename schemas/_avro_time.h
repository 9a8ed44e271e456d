/* Avro timestamp-micros -> an aware UTC datetime, shared by the C decoders (_rawline.c,
 * _eventbatch.c). Equal to datetime(1970, 1, 1, tzinfo=utc) + timedelta(microseconds=us), as
 * the Python decoders and fastavro give it. Include after Python.h and datetime.h; the module
 * must have run PyDateTime_IMPORT. */
#ifndef FIRSTFAULT_AVRO_TIME_H
#define FIRSTFAULT_AVRO_TIME_H

#include <stdint.h>

#define USEC_PER_DAY INT64_C(86400000000)

/* days since 1970-01-01 -> civil date (H. Hinnant's civil_from_days). */
static void
civil_from_days(int64_t z, int64_t *y, int *m, int *d)
{
    z += 719468;
    const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    const int64_t doe = z - era * 146097;
    const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    const int64_t mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = yoe + era * 400 + (*m <= 2);
}

/* The datetime, or NULL with *out_of_range set outside years 1..9999 (where the addition
 * overflows), or NULL with a Python error set. */
static PyObject *
utc_from_micros(int64_t us, int *out_of_range)
{
    int64_t days = us / USEC_PER_DAY, rem = us % USEC_PER_DAY;
    if (rem < 0) {
        rem += USEC_PER_DAY;
        days -= 1;
    }
    int64_t y;
    int m, d;
    civil_from_days(days, &y, &m, &d);
    if (y < 1 || y > 9999) {
        *out_of_range = 1;
        return NULL;
    }
    int64_t secs = rem / 1000000;
    return PyDateTimeAPI->DateTime_FromDateAndTime(
        (int)y, m, d, (int)(secs / 3600), (int)(secs / 60 % 60), (int)(secs % 60), (int)(rem % 1000000),
        PyDateTime_TimeZone_UTC, PyDateTimeAPI->DateTimeType);
}

#endif
