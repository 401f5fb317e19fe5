/* The C ABI of an Arke bundle (format 1): every kernel of the bundle is one function.
 *
 *   int arke_<kernel>(const arke_tensor *args, int64_t n_args,
 *                     arke_tensor *results, int64_t n_results,
 *                     int32_t threads, arke_error *err);
 *
 * args:    one tensor per parameter, in declaration order. A scalar parameter is a tensor of rank 0
 *          whose data points at one value of the parameter's dtype; a dim parameter (`G: dim`) is a
 *          rank-0 ARKE_I64 tensor. Tensors are dense and row-major: `strides` is NULL, or the
 *          row-major strides (in elements) of `shape`. `layout` is 0, or, for a weight [N, K] that a
 *          contraction reads prepacked, its panels: nr > 0 for f32 panels [ceil(N/nr)][K][nr], -1 for
 *          VNNI panels (arke.runtime.panels packs both); a kernel that cannot read them refuses them.
 * results: one tensor per result, allocated by the caller with the result's shape and dtype
 *          (arke_<kernel>_result_shape says which); they may not overlap the arguments.
 * threads: worker threads (0: one per core the process may run on).
 * Returns ARKE_OK, or an error code with `err` filled in: the same rule and message as the Python
 * guards give (the message begins "kernel `name`: "). On an error the results are untouched.
 *
 *   int arke_<kernel>_result_shape(const arke_tensor *args, int64_t n_args, int64_t result,
 *                                  int64_t *shape, arke_error *err);
 *
 * checks the arguments as a call does, then writes result `result`'s shape (its rank is fixed:
 * see the kernel's comment below) into `shape`.
 *
 * Calls may come from several threads: each call's dispatches run on a pool of worker threads
 * shared by the library (calls take turns on it).
 */
#ifndef ARKE_BUNDLE_ABI_H
#define ARKE_BUNDLE_ABI_H

#include <stdint.h>

#define ARKE_ABI_VERSION 1

typedef enum arke_dtype {
    ARKE_BOOL = 0, ARKE_I8 = 1, ARKE_I32 = 2, ARKE_I64 = 3, ARKE_U8 = 4, ARKE_U16 = 5, ARKE_U32 = 6,
    ARKE_F16 = 7, ARKE_BF16 = 8, ARKE_F32 = 9
} arke_dtype;

typedef struct arke_tensor {
    void *data;
    int32_t dtype;           /* an arke_dtype */
    int32_t ndim;
    const int64_t *shape;    /* ndim sizes */
    const int64_t *strides;  /* NULL (row-major), or ndim strides in elements */
    int32_t layout;          /* 0: row-major; nr > 0: f32 panels of width nr; -1: VNNI panels */
    int32_t reserved;        /* 0 */
} arke_tensor;

enum {
    ARKE_OK = 0,
    ARKE_ERR_ARGS = 1,     /* rules arity, missing, type */
    ARKE_ERR_SHAPE = 2,    /* rules rank, dim, where, size, index */
    ARKE_ERR_DTYPE = 3,    /* rule dtype */
    ARKE_ERR_RUNTIME = 4   /* rules threads, memory, cpu */
};

typedef struct arke_error {
    int32_t code;
    char rule[16];       /* the GuardError rule: "rank", "dtype", "dim", "where", ... */
    char param[64];      /* the parameter concerned, or "" */
    char message[1024];  /* "kernel `name`: ..." */
} arke_error;

#endif
