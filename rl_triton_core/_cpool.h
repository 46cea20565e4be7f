/* The threads of the CPU kernels' parallel calls (_cscan.c, _ctoken.c): run(arg) on
 * `threads` threads, the caller's one of them, each taking its work from a counter the
 * job shares (a thread that is slowed down takes less).
 *
 * Where the process has loaded an OpenMP runtime named libgomp.so.1 (torch's Linux wheels
 * ship and load theirs), the threads are that runtime's team, through GOMP_parallel,
 * the entry point a `#pragma omp parallel` compiles to. Right after a torch op, torch's
 * OpenMP workers spin on the other cores for a while, waiting for work: a thread of our
 * own that shares a core with one of them is descheduled for a whole time slice and the
 * call waits for it (a 2-core VM, 4096 x 128 right after a torch op: 2.6 ms on two threads
 * of ours against 0.93 on one). Given to the team, the work goes to those spinning
 * workers. Elsewhere (no libgomp loaded, macOS, Windows) they are POSIX threads started
 * for the call, or the caller alone on Windows.
 *
 * pool_find() looks the runtime up once; call it with the GIL held. */
#ifndef RL_TRITON_CORE_CPOOL_H
#define RL_TRITON_CORE_CPOOL_H

#ifndef _WIN32
#include <dlfcn.h>
#include <pthread.h>
#endif

#define POOL_MAX_THREADS 64

typedef void (*pool_fn_t)(void *);
typedef void (*gomp_parallel_t)(void (*)(void *), void *, unsigned, unsigned);

static gomp_parallel_t pool_gomp = NULL;
static int pool_looked = 0;
static int pool_use_gomp = 1; /* tests switch it off to reach the POSIX threads */

static void pool_find(void) {
    if (pool_looked) return;
    pool_looked = 1;
#if !defined(_WIN32) && defined(RTLD_NOLOAD)
    void *h = dlopen("libgomp.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (h) pool_gomp = (gomp_parallel_t)dlsym(h, "GOMP_parallel");
#endif
}

/* 1 where a call's threads are the OpenMP team */
static inline int pool_is_gomp(void) {
    pool_find();
    return pool_use_gomp && pool_gomp != NULL;
}

#ifndef _WIN32
typedef struct {
    pool_fn_t fn;
    void *arg;
} pool_thunk_t;

static void *pool_thread(void *p) {
    const pool_thunk_t *t = (const pool_thunk_t *)p;
    t->fn(t->arg);
    return NULL;
}
#endif

/* fn(arg) on `threads` threads (the caller's one of them), back when all are done */
static void pool_run(pool_fn_t fn, void *arg, int threads) {
    if (threads > POOL_MAX_THREADS) threads = POOL_MAX_THREADS;
#ifndef _WIN32
    if (threads > 1 && pool_use_gomp && pool_gomp) {
        pool_gomp(fn, arg, (unsigned)threads, 0);
        return;
    }
    if (threads > 1) {
        pool_thunk_t t = {fn, arg};
        pthread_t tid[POOL_MAX_THREADS];
        int started = 0;
        for (int i = 1; i < threads; i++)
            if (pthread_create(&tid[started], NULL, pool_thread, &t) == 0) started++;
        fn(arg);
        for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
        return;
    }
#endif
    fn(arg);
}

#endif
