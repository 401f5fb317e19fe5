/* The run time of an Arke bundle, compiled into its shared library: error reporting, checked dim
 * arithmetic, and the worker pool that runs a dispatch's chunks. No compiler, no Python. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>

#include "arke_bundle.h"
#include "runtime.h"

int ak_fail(arke_error *err, int code, const char *rule, const char *param, const char *fmt, ...) {
    if (err == NULL) return code;
    err->code = code;
    snprintf(err->rule, sizeof err->rule, "%s", rule);
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return code;
}

void ak_clear(arke_error *err) {
    if (err == NULL) return;
    err->code = 0;
    err->rule[0] = err->param[0] = err->message[0] = 0;
}

const char *ak_shape_text(const arke_tensor *t, char *buf, size_t size) {
    if (t->ndim == 0) { snprintf(buf, size, "a scalar"); return buf; }
    size_t at = (size_t)snprintf(buf, size, "shape [");
    for (int32_t i = 0; i < t->ndim && at < size; i++)
        at += (size_t)snprintf(buf + at, size - at, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (at < size) snprintf(buf + at, size - at, "]");
    return buf;
}

static const char *DTYPE_NAMES[] = {"bool", "i8", "i32", "i64", "u8", "u16", "u32", "f16", "bf16", "f32"};

const char *ak_dtype_name(int32_t dtype) {
    return dtype >= 0 && dtype < 10 ? DTYPE_NAMES[dtype] : "an unknown dtype";
}

int ak_dense(const arke_tensor *t) {
    if (t->strides == NULL) return 1;
    int64_t step = 1;
    for (int32_t i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != step) return 0;
        step *= t->shape[i];
    }
    return 1;
}

/* Python's floor division and modulo (the dims' `//` and `%`), and checked + - * ** on 64 bits. */
int64_t ak_floordiv(int64_t a, int64_t b, int *bad) {
    if (b == 0) { *bad = 1; return 0; }
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
    return q;
}

int64_t ak_mod(int64_t a, int64_t b, int *bad) {
    if (b == 0) { *bad = 1; return 0; }
    int64_t r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
}

int64_t ak_add(int64_t a, int64_t b, int *bad) { int64_t r; if (__builtin_add_overflow(a, b, &r)) *bad = 1; return r; }
int64_t ak_sub(int64_t a, int64_t b, int *bad) { int64_t r; if (__builtin_sub_overflow(a, b, &r)) *bad = 1; return r; }
int64_t ak_mul(int64_t a, int64_t b, int *bad) { int64_t r; if (__builtin_mul_overflow(a, b, &r)) *bad = 1; return r; }

int64_t ak_pow(int64_t a, int64_t b, int *bad) {
    if (b < 0) { *bad = 1; return 0; }
    int64_t r = 1;
    while (b-- > 0) r = ak_mul(r, a, bad);
    return r;
}

int ak_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set) > 0 ? CPU_COUNT(&set) : 1;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int ak_worker_limit(void) {
    int n = 4 * ak_cores();
    return n > 8 ? n : 8;
}

void *ak_alloc(int64_t bytes) {
    size_t size = (size_t)(bytes > 0 ? bytes : 1);
    size = (size + 63) & ~(size_t)63;
    return aligned_alloc(64, size);
}

int ak_amx_permit(void) {
#if defined(__x86_64__)
    /* arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): Linux grants tile data per process */
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return 0;
#endif
}

/* ---------------------------------------------------------------- the worker pool
 * A job is one dispatch cut into `chunks` static, contiguous chunks of [0, n) (chunk k is
 * [k*n/chunks, (k+1)*n/chunks), as the JIT runtime cuts them: reductions never cross a chunk, so
 * results do not depend on the thread count). The caller runs chunks too; workers claim the rest. */

#define AK_MAX_WORKERS 1024

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_go = PTHREAD_COND_INITIALIZER;
static pthread_cond_t pool_done = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t call_mu = PTHREAD_MUTEX_INITIALIZER;  /* one job on the pool at a time */
static int pool_workers = 0;
static int64_t pool_gen = 0;

static struct {
    ak_entry fn;
    void **bufs;
    const int64_t *dims;
    int64_t n, chunks, next, running;
    int64_t *errors;
    char *scratch;
    int64_t scratch_bytes;
} job;

static void run_chunk(int64_t k) {
    int64_t lo = k * job.n / job.chunks, hi = (k + 1) * job.n / job.chunks;
    job.fn(job.bufs, job.dims, lo, hi, job.errors + k,
           job.scratch ? job.scratch + k * job.scratch_bytes : NULL);
}

/* Claim and run chunks until none is left; pool_mu is held on entry and on return. */
static void drain(void) {
    while (job.next < job.chunks) {
        int64_t k = job.next++;
        job.running++;
        pthread_mutex_unlock(&pool_mu);
        run_chunk(k);
        pthread_mutex_lock(&pool_mu);
        job.running--;
    }
    if (job.running == 0) pthread_cond_broadcast(&pool_done);
}

static void *worker(void *unused) {
    (void)unused;
    pthread_mutex_lock(&pool_mu);
    int64_t seen = pool_gen;
    for (;;) {
        while (pool_gen == seen) pthread_cond_wait(&pool_go, &pool_mu);
        seen = pool_gen;
        drain();
    }
    return NULL;
}

static void grow_pool(int wanted) {
    while (pool_workers < wanted && pool_workers < AK_MAX_WORKERS) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&t, &attr, worker, NULL);
        pthread_attr_destroy(&attr);
        if (failed) break;  /* fewer workers: the caller runs the chunks left */
        pool_workers++;
    }
}

int ak_run(ak_entry fn, void **bufs, const int64_t *dims, int64_t n, int64_t chunks, int64_t scratch_bytes,
           int64_t *errors, arke_error *err, const char *kernel) {
    if (n <= 0) return ARKE_OK;
    if (chunks < 1) chunks = 1;
    if (chunks > n) chunks = n;
    char *scratch = NULL;
    if (scratch_bytes > 0) {
        scratch = ak_alloc(scratch_bytes * chunks);
        if (scratch == NULL)
            return ak_fail(err, ARKE_ERR_RUNTIME, "memory", NULL, "kernel `%s`: out of memory for %lld bytes of "
                           "scratch", kernel, (long long)(scratch_bytes * chunks));
    }
    if (chunks == 1) {
        fn(bufs, dims, 0, n, errors, scratch);
        free(scratch);
        return ARKE_OK;
    }
    pthread_mutex_lock(&call_mu);
    pthread_mutex_lock(&pool_mu);
    grow_pool((int)chunks - 1);
    job.fn = fn; job.bufs = bufs; job.dims = dims; job.n = n; job.chunks = chunks; job.next = 0;
    job.running = 0; job.errors = errors; job.scratch = scratch; job.scratch_bytes = scratch_bytes;
    pool_gen++;
    pthread_cond_broadcast(&pool_go);
    drain();
    while (job.running > 0 || job.next < job.chunks) pthread_cond_wait(&pool_done, &pool_mu);
    pthread_mutex_unlock(&pool_mu);
    pthread_mutex_unlock(&call_mu);
    free(scratch);
    return ARKE_OK;
}

int64_t ak_nbytes(const arke_tensor *t) {
    static const int64_t size[] = {1, 1, 4, 8, 1, 2, 4, 2, 2, 4};
    int64_t n = t->dtype >= 0 && t->dtype < 10 ? size[t->dtype] : 1;
    for (int32_t i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

static void forget_pool(void) {
    /* a forked child has none of the pool's threads: it starts a pool of its own */
    pool_workers = 0;
    pthread_mutex_init(&pool_mu, NULL);
    pthread_mutex_init(&call_mu, NULL);
    pthread_cond_init(&pool_go, NULL);
    pthread_cond_init(&pool_done, NULL);
}

__attribute__((constructor)) static void ak_init(void) { pthread_atfork(NULL, NULL, forget_pool); }

int32_t arke_bundle_abi_version(void) { return ARKE_ABI_VERSION; }
