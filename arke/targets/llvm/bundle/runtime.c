/* The run time of an Arke bundle, compiled into its shared library: error reporting, checked dim
 * arithmetic, and the worker pool that runs a dispatch's chunks. No compiler, no Python. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
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
    if (t->shape == NULL || t->ndim < 0) { snprintf(buf, size, "no shape"); return buf; }
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
 * results do not depend on the thread count). The caller publishes the job and runs chunks too;
 * workers claim the rest. A claim is a compare-and-swap on one word holding the job's generation
 * and its next chunk, so a worker that wakes late never claims a chunk of a job it did not read;
 * jobs alternate between two slots, so the one a late worker reads is never being rewritten while
 * its claim could still succeed. After a job a worker spins on the word for a while (a decode step
 * posts jobs back to back), then sleeps on a condition variable until the next job wakes it. */

#define AK_MAX_WORKERS 1024
#define AK_SPINS 20000

typedef struct {
    ak_entry fn;
    void **bufs;
    const int64_t *dims;
    int64_t n, chunks, scratch_bytes;
    int64_t *errors;
    char *scratch;
    _Atomic int64_t done;
} ak_job;

static ak_job jobs[2];
static _Atomic uint64_t ticket;      /* generation << 32 | next chunk */
static _Atomic int sleepers;
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_go = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t call_mu = PTHREAD_MUTEX_INITIALIZER;  /* one job on the pool at a time */
static int pool_workers = 0;

static inline void relax(void) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Claim and run chunks of generation `gen` until none is left. */
static void work(uint64_t gen) {
    ak_job *job = &jobs[gen & 1];
    for (;;) {
        uint64_t seen = atomic_load(&ticket);
        if ((seen >> 32) != gen) return;
        int64_t k = (int64_t)(seen & 0xffffffffu), chunks = job->chunks;
        if (k >= chunks) return;
        ak_entry fn = job->fn;
        void **bufs = job->bufs;
        const int64_t *dims = job->dims;
        int64_t n = job->n, width = job->scratch_bytes;
        int64_t *errors = job->errors;
        char *scratch = job->scratch;
        if (!atomic_compare_exchange_weak(&ticket, &seen, seen + 1)) continue;
        fn(bufs, dims, k * n / chunks, (k + 1) * n / chunks, errors + k, scratch ? scratch + k * width : NULL);
        atomic_fetch_add(&job->done, 1);
    }
}

static void *worker(void *unused) {
    (void)unused;
    uint64_t gen = atomic_load(&ticket) >> 32;
    for (;;) {
        int spins = 0;
        uint64_t now;
        while ((now = atomic_load(&ticket) >> 32) == gen) {
            if (spins++ < AK_SPINS) { relax(); continue; }
            pthread_mutex_lock(&pool_mu);
            atomic_fetch_add(&sleepers, 1);
            while ((atomic_load(&ticket) >> 32) == gen) pthread_cond_wait(&pool_go, &pool_mu);
            atomic_fetch_sub(&sleepers, 1);
            pthread_mutex_unlock(&pool_mu);
            spins = 0;
        }
        gen = now;
        work(gen);
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
    grow_pool((int)chunks - 1);
    uint64_t gen = (atomic_load(&ticket) >> 32) + 1;
    ak_job *job = &jobs[gen & 1];
    job->fn = fn; job->bufs = bufs; job->dims = dims; job->n = n; job->chunks = chunks;
    job->scratch_bytes = scratch_bytes; job->errors = errors; job->scratch = scratch;
    atomic_store(&job->done, 0);
    atomic_store(&ticket, gen << 32);  /* publishes the job: its fields were written first */
    if (atomic_load(&sleepers) > 0) {
        pthread_mutex_lock(&pool_mu);
        pthread_cond_broadcast(&pool_go);
        pthread_mutex_unlock(&pool_mu);
    }
    work(gen);
    while (atomic_load(&job->done) < chunks) relax();
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
    atomic_store(&sleepers, 0);
    pthread_mutex_init(&pool_mu, NULL);
    pthread_mutex_init(&call_mu, NULL);
    pthread_cond_init(&pool_go, NULL);
}

__attribute__((constructor)) static void ak_init(void) { pthread_atfork(NULL, NULL, forget_pool); }

int32_t arke_bundle_abi_version(void) { return ARKE_ABI_VERSION; }
