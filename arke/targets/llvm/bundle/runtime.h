/* The bundle run time's internal interface (runtime.c), used by the generated kernel wrappers. */
#ifndef ARKE_BUNDLE_RUNTIME_H
#define ARKE_BUNDLE_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "arke_bundle.h"

/* A dispatch's entry point behind a uniform signature: the buffers, the dims words, the chunk
 * [lo, hi), the chunk's error word and its scratch memory. */
typedef void (*ak_entry)(void **bufs, const int64_t *dims, int64_t lo, int64_t hi, int64_t *error, void *scratch);

int ak_fail(arke_error *err, int code, const char *rule, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void ak_clear(arke_error *err);
const char *ak_shape_text(const arke_tensor *t, char *buf, size_t size);
const char *ak_dtype_name(int32_t dtype);
int ak_dense(const arke_tensor *t);
int64_t ak_floordiv(int64_t a, int64_t b, int *bad);
int64_t ak_mod(int64_t a, int64_t b, int *bad);
int64_t ak_add(int64_t a, int64_t b, int *bad);
int64_t ak_sub(int64_t a, int64_t b, int *bad);
int64_t ak_mul(int64_t a, int64_t b, int *bad);
int64_t ak_pow(int64_t a, int64_t b, int *bad);
int ak_cores(void);
int ak_worker_limit(void);
void *ak_alloc(int64_t bytes);
int ak_amx_permit(void);
int64_t ak_nbytes(const arke_tensor *t);
int ak_run(ak_entry fn, void **bufs, const int64_t *dims, int64_t n, int64_t chunks, int64_t scratch_bytes,
           int64_t *errors, arke_error *err, const char *kernel);

#endif
