/* Run one kernel of an Arke bundle from C, with no Python and no compiler.
 *
 *   cc -O2 -o run_case run_case.c -ldl
 *   ./run_case BUNDLE_DIR KERNEL CASE_FILE [THREADS]
 *
 * The bundle comes from `akc build FILE --target llvm --bundle BUNDLE_DIR`. CASE_FILE holds the
 * arguments and the expected results (little-endian):
 *
 *   int64 n_args;    then per argument: int32 dtype, int32 ndim, int64 shape[ndim], the data
 *   int64 n_results; then per result:   int32 dtype, int32 ndim, int64 shape[ndim], the expected data,
 *                    and for a float result, the error each element may have (float64, one per element)
 *
 * The program opens the bundle's library with dlopen, asks arke_<KERNEL>_result_shape for each
 * result's shape, calls arke_<KERNEL>, and compares each result with the expected one
 * (floats within their element's bound, the test suite's tolerance rule; integers exactly). It prints "ok" and the largest error,
 * or the bundle's error (code, rule and message) and exits 3, or the first mismatch and exits 4.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arke_bundle.h"

typedef int (*kernel_fn)(const arke_tensor *, int64_t, arke_tensor *, int64_t, int32_t, arke_error *);
typedef int (*shape_fn)(const arke_tensor *, int64_t, int64_t, int64_t *, arke_error *);

static const int64_t ELEMENT[] = {1, 1, 4, 8, 1, 2, 4, 2, 2, 4};

static int64_t count(const arke_tensor *t) {
    int64_t n = 1;
    for (int32_t i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

static void must_read(void *to, size_t bytes, FILE *f) {
    if (bytes && fread(to, 1, bytes, f) != bytes) {
        fprintf(stderr, "the case file ends early\n");
        exit(2);
    }
}

/* One tensor from the case file: header, then data. */
static void read_tensor(FILE *f, arke_tensor *t) {
    must_read(&t->dtype, 4, f);
    must_read(&t->ndim, 4, f);
    if (t->dtype < 0 || t->dtype > 9 || t->ndim < 0 || t->ndim > 16) {
        fprintf(stderr, "the case file holds a bad tensor header\n");
        exit(2);
    }
    int64_t *shape = calloc((size_t)t->ndim + 1, sizeof(int64_t));
    must_read(shape, 8 * (size_t)t->ndim, f);
    t->shape = shape;
    t->strides = NULL;
    t->layout = t->reserved = 0;
    size_t bytes = (size_t)(count(t) * ELEMENT[t->dtype]);
    t->data = malloc(bytes ? bytes : 1);
    must_read(t->data, bytes, f);
}

static double f16_value(uint16_t h) {
    int exp = (h >> 10) & 31, frac = h & 1023;
    double v = exp == 0 ? ldexp(frac, -24) : exp == 31 ? (frac ? NAN : INFINITY) : ldexp(frac + 1024, exp - 25);
    return (h & 0x8000) ? -v : v;
}

/* Element i of a tensor as a double. */
static double value(const arke_tensor *t, int64_t i) {
    const char *p = t->data;
    switch (t->dtype) {
    case ARKE_BOOL: case ARKE_U8: return ((const uint8_t *)p)[i];
    case ARKE_I8: return ((const int8_t *)p)[i];
    case ARKE_I32: return ((const int32_t *)p)[i];
    case ARKE_I64: return (double)((const int64_t *)p)[i];
    case ARKE_U16: return ((const uint16_t *)p)[i];
    case ARKE_U32: return ((const uint32_t *)p)[i];
    case ARKE_F16: return f16_value(((const uint16_t *)p)[i]);
    case ARKE_BF16: { uint32_t bits = (uint32_t)((const uint16_t *)p)[i] << 16; float f; memcpy(&f, &bits, 4); return f; }
    default: return ((const float *)p)[i];
    }
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s BUNDLE_DIR KERNEL CASE_FILE [THREADS]\n", argv[0]);
        return 2;
    }
    char path[4096], symbol[512];
    snprintf(path, sizeof path, "%s/libarke_bundle.so", argv[1]);
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "cannot open the bundle: %s\n", dlerror());
        return 2;
    }
    snprintf(symbol, sizeof symbol, "arke_%s", argv[2]);
    kernel_fn kernel = (kernel_fn)dlsym(lib, symbol);
    snprintf(symbol, sizeof symbol, "arke_%s_result_shape", argv[2]);
    shape_fn result_shape = (shape_fn)dlsym(lib, symbol);
    if (!kernel || !result_shape) {
        fprintf(stderr, "the bundle has no kernel %s\n", argv[2]);
        return 2;
    }
    FILE *f = fopen(argv[3], "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", argv[3]);
        return 2;
    }
    int64_t n_args, n_results;
    must_read(&n_args, 8, f);
    if (n_args < 0 || n_args > 64) return 2;
    arke_tensor args[64], want[64], got[64];
    double *bound[64] = {0};
    for (int64_t i = 0; i < n_args; i++) read_tensor(f, &args[i]);
    must_read(&n_results, 8, f);
    if (n_results < 0 || n_results > 64) return 2;
    for (int64_t i = 0; i < n_results; i++) {
        read_tensor(f, &want[i]);
        if (want[i].dtype > ARKE_U32) {  /* a float result: its bounds */
            bound[i] = malloc(8 * (size_t)count(&want[i]) + 8);
            must_read(bound[i], 8 * (size_t)count(&want[i]), f);
        }
    }
    fclose(f);

    arke_error err;
    for (int64_t r = 0; r < n_results; r++) {
        int64_t *shape = calloc((size_t)want[r].ndim + 1, sizeof(int64_t));
        if (result_shape(args, n_args, r, shape, &err) != ARKE_OK) {
            printf("error %d %s: %s\n", err.code, err.rule, err.message);
            return 3;
        }
        got[r] = want[r];
        got[r].shape = shape;
        got[r].data = calloc((size_t)(count(&want[r]) * ELEMENT[want[r].dtype]) + 1, 1);
    }
    int32_t threads = argc > 4 ? atoi(argv[4]) : 0;
    if (kernel(args, n_args, got, n_results, threads, &err) != ARKE_OK) {
        printf("error %d %s: %s\n", err.code, err.rule, err.message);
        return 3;
    }
    double worst = 0;
    for (int64_t r = 0; r < n_results; r++) {
        for (int64_t i = 0; i < count(&want[r]); i++) {
            double a = value(&got[r], i), b = value(&want[r], i), e = fabs(a - b);
            int same = a == b || (isnan(a) && isnan(b)) || (isinf(b) && a == b) || (bound[r] ? e <= bound[r][i] : a == b);
            if (!same) {
                printf("mismatch: result %lld element %lld is %.9g, expected %.9g\n", (long long)r, (long long)i, a, b);
                return 4;
            }
            if (!isnan(e) && !isinf(b) && e > worst) worst = e;
        }
    }
    printf("ok %d results, max error %.3g\n", (int)n_results, worst);
    return 0;
}
