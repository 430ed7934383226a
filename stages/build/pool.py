"""A persistent worker pool linked into every library, in place of a thread per kernel call.

A template's threaded `tf_main` starts its helper threads with `pthread_create` and waits with
`pthread_join` on every call: fine for timing one kernel, but a model calls a dozen small
kernels per inference, and creating and joining threads costs tens of microseconds each time.
The library build renames those two calls in every anchor kernel to `tf_pool_create` /
`tf_pool_join` (same signatures), served by this pool: workers start once, spin briefly
for the next job, then sleep on a condition variable, so a threaded model pays a handshake, not
a thread start, per kernel.
"""

from __future__ import annotations

import re

CREATE, JOIN = "tf_pool_create", "tf_pool_join"

SOURCE = r"""
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>

#define TF_WORKERS 256
#define TF_SPINS 20000

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  void *(*fn)(void *);
  void *arg;
  _Atomic long posted, done;
  int sleeping, started;
} tf_worker;

static tf_worker tf_workers[TF_WORKERS];
static pthread_mutex_t tf_start_mu = PTHREAD_MUTEX_INITIALIZER;

static inline void tf_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  sched_yield();
#endif
}

static void *tf_worker_main(void *p) {
  tf_worker *w = p;
  long seen = 0;
  for (;;) {
    int spins = 0;
    while (atomic_load_explicit(&w->posted, memory_order_acquire) == seen) {
      if (++spins < TF_SPINS) { tf_relax(); continue; }
      pthread_mutex_lock(&w->mu);
      w->sleeping = 1;
      while (atomic_load_explicit(&w->posted, memory_order_acquire) == seen) pthread_cond_wait(&w->cv, &w->mu);
      w->sleeping = 0;
      pthread_mutex_unlock(&w->mu);
    }
    seen++;
    w->fn(w->arg);
    atomic_store_explicit(&w->done, seen, memory_order_release);
  }
  return 0;
}

__attribute__((visibility("hidden"))) int tf_pool_create(int64_t *tid, void *attr, void *(*fn)(void *), void *arg) {
  (void)attr;
  for (int i = 0; i < TF_WORKERS; i++) {
    tf_worker *w = &tf_workers[i];
    if (atomic_load_explicit(&w->done, memory_order_acquire) != atomic_load_explicit(&w->posted, memory_order_relaxed))
      continue;
    if (!w->started) {
      pthread_mutex_lock(&tf_start_mu);
      if (!w->started) {
        pthread_t t;
        pthread_mutex_init(&w->mu, 0);
        pthread_cond_init(&w->cv, 0);
        if (pthread_create(&t, 0, tf_worker_main, w) != 0) { pthread_mutex_unlock(&tf_start_mu); break; }
        pthread_detach(t);
        w->started = 1;
      }
      pthread_mutex_unlock(&tf_start_mu);
    }
    w->fn = fn;
    w->arg = arg;
    atomic_fetch_add_explicit(&w->posted, 1, memory_order_release);
    pthread_mutex_lock(&w->mu);
    if (w->sleeping) pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    *tid = i;
    return 0;
  }
  fn(arg);  /* no worker available: run the chunk on the calling thread */
  *tid = -1;
  return 0;
}

__attribute__((visibility("hidden"))) int tf_pool_join(int64_t tid, void **ret) {
  (void)ret;
  if (tid < 0) return 0;
  tf_worker *w = &tf_workers[tid];
  int spins = 0;
  while (atomic_load_explicit(&w->done, memory_order_acquire) != atomic_load_explicit(&w->posted, memory_order_relaxed))
    if (++spins < TF_SPINS) tf_relax(); else sched_yield();
  return 0;
}
"""


def use_pool(ir_text: str) -> str:
    """An anchor module's IR with its thread starts and joins sent to the pool."""
    return re.sub(r'@"?pthread_(create|join)"?(?=[\s(,)])', lambda m: f'@"tf_pool_{m.group(1)}"', ir_text)
