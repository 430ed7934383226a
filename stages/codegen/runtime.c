/* tunaflow's runtime: a persistent worker pool for the parallel loops of generated kernels.
 *
 * A threaded kernel calls tf_parallel_for(body, args, extent, threads) instead of starting
 * threads: starting and joining them cost ~75 us per call here, more than a small kernel runs.
 * Workers start once, spin for the next loop, then sleep on a futex. The spin covers the gaps
 * between kernels of one inference and, by default (2 ms), the gap between the inferences of a
 * server under load: waking a sleeping worker costs a VM tens to hundreds of microseconds, and a
 * 2-thread model called every 0.3 ms here took 0.22-0.23 ms a call with 0.2 ms of spin (0.39
 * before workers were pinned), 0.17-0.19 with 2 ms. TUNAFLOW_SPIN_US (read when the first worker
 * starts) trades that latency for the CPU a spinning worker burns: 0 sleeps at once.
 *
 * Each worker is pinned to its own allowed CPU, the ones after the caller's (TUNAFLOW_PIN=0 leaves
 * them to the scheduler): unpinned, a worker woken after a pause shared the caller's vCPU here for
 * whole runs of calls (the 2-thread CNN's 40-call turns at 0.21-0.31 ms instead of 0.16, scattered;
 * pinned, its turns stayed at 0.15-0.17 except where the host slowed both builds alike). A loop whose
 * caller has come to run on a worker's CPU moves the workers after it again (`keep_off_caller`).
 *
 * The loop is cut into `threads` contiguous chunks that anyone may claim, the caller included:
 * when a worker is slow to wake (its core taken by another runtime's spinning threads), the
 * caller runs the chunk itself, so a busy machine degrades to one thread, never below it.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef void (*tf_body)(void *args, int64_t begin, int64_t end);

#define TF_MAX_WORKERS 63
#define TF_SPIN_NS_DEFAULT 2000000L /* 2 ms */

static struct {
  pthread_mutex_t busy;   /* one parallel loop at a time; a concurrent caller runs serially */
  _Atomic uint32_t gen;   /* bumped to publish a loop; the workers' futex word */
  _Atomic int sleepers;
  _Atomic uint64_t ticket; /* gen << 32 | chunks << 16 | next unclaimed chunk */
  _Atomic int64_t done;    /* chunks finished in the current loop */
  tf_body fn;
  void *args;
  int64_t extent, chunks;
  int workers;
  int64_t spin_ns;
  pthread_t thread[TF_MAX_WORKERS];
  int cpu[TF_MAX_WORKERS]; /* the CPU worker w is pinned to, -1 when not pinned */
} P = {.busy = PTHREAD_MUTEX_INITIALIZER};

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Claims the next chunk of loop `g`; 0 once that loop has none left (or is over). */
static int claim(uint32_t g, int64_t *chunk) {
  uint64_t t = atomic_load(&P.ticket);
  for (;;) {
    if ((uint32_t)(t >> 32) != g || (t & 0xffff) >= ((t >> 16) & 0xffff)) return 0;
    if (atomic_compare_exchange_weak(&P.ticket, &t, t + 1)) {
      *chunk = (int64_t)(t & 0xffff);
      return 1;
    }
  }
}

/* A claimed chunk keeps its loop from finishing, so fn/args/extent are stable here. */
static void run_chunk(int64_t c) {
  P.fn(P.args, P.extent * c / P.chunks, P.extent * (c + 1) / P.chunks);
  atomic_fetch_add_explicit(&P.done, 1, memory_order_release);
}

static uint32_t wait_for_loop(uint32_t seen) {
  int64_t start = now_ns();
  for (int i = 1;; i++) {
    uint32_t g = atomic_load_explicit(&P.gen, memory_order_acquire);
    if (g != seen) return g;
    relax();
    if ((i & 63) == 0 && now_ns() - start > P.spin_ns) break;
  }
  for (;;) {
    atomic_fetch_add(&P.sleepers, 1);
    if (atomic_load(&P.gen) == seen) syscall(SYS_futex, &P.gen, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
    atomic_fetch_sub(&P.sleepers, 1);
    uint32_t g = atomic_load_explicit(&P.gen, memory_order_acquire);
    if (g != seen) return g;
  }
}

/* Denormal floats read and written as zero (x86 MXCSR DAZ and FTZ, arm64 FPCR.FZ) while a model runs:
 * an FMA on a denormal operand takes a microcode assist ~100x as slow, and a sigmoid's tail times a
 * small activation makes them (squeeze-and-excitation blocks: EfficientNet-B0's 1x1 convs after
 * them ran 0.8 GFLOPS on inputs 10-15% denormal). Values below 1.2e-38 become 0: far under any
 * tolerance. The caller's mode is restored when the model returns; workers keep it. */
uint64_t tf_fp_enter(void) {
#if defined(__x86_64__) || defined(__i386__)
  uint32_t old = __builtin_ia32_stmxcsr();
  __builtin_ia32_ldmxcsr(old | 0x8040u);
  return old;
#elif defined(__aarch64__)
  uint64_t old;
  __asm__ volatile("mrs %0, fpcr" : "=r"(old));
  __asm__ volatile("msr fpcr, %0" : : "r"(old | (1ull << 24)));
  return old;
#else
  return 0;
#endif
}

void tf_fp_leave(uint64_t old) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_ldmxcsr((uint32_t)old);
#elif defined(__aarch64__)
  __asm__ volatile("msr fpcr, %0" : : "r"(old));
#else
  (void)old;
#endif
}

/* AMX tile data (Intel's `amx-int8` kernels) needs the process's permission first: Linux keeps the 8 KiB
 * of tile state out of every thread's context until someone asks (arch_prctl ARCH_REQ_XCOMP_PERM, Linux
 * 5.16 and later), and a tile instruction before that is SIGILL. The permission covers every thread of the
 * process, so an AMX kernel asks once, on entry; a refusal is a clear message and an abort, not a SIGILL. */
#define TF_ARCH_REQ_XCOMP_PERM 0x1023
#define TF_XFEATURE_XTILEDATA 18
static _Atomic int amx_granted;

void tf_amx_request(void) {
  if (atomic_load_explicit(&amx_granted, memory_order_acquire)) return;
#if defined(__x86_64__)
  if (syscall(SYS_arch_prctl, TF_ARCH_REQ_XCOMP_PERM, TF_XFEATURE_XTILEDATA) == 0) {
    atomic_store_explicit(&amx_granted, 1, memory_order_release);
    return;
  }
  perror("tunaflow: an AMX kernel asked Linux for tile data (arch_prctl ARCH_REQ_XCOMP_PERM) and was refused");
#else
  fputs("tunaflow: an AMX kernel runs only on x86-64\n", stderr);
#endif
  abort();
}

static void *worker_main(void *gen_at_start) {
  uint32_t seen = (uint32_t)(uintptr_t)gen_at_start;
  tf_fp_enter();
  for (;;) {
    uint32_t g = wait_for_loop(seen);
    int64_t c;
    while (claim(g, &c)) run_chunk(c);
    seen = g;
  }
  return NULL;
}

static int64_t spin_from_env(void) {
  const char *v = getenv("TUNAFLOW_SPIN_US");
  if (v == NULL || *v == '\0') return TF_SPIN_NS_DEFAULT;
  char *end;
  long long us = strtoll(v, &end, 10);
  return (*end != '\0' || us < 0) ? TF_SPIN_NS_DEFAULT : (int64_t)us * 1000;
}

static int pin_from_env(void) {
  const char *v = getenv("TUNAFLOW_PIN");
  return v == NULL || strcmp(v, "0") != 0;
}

/* Worker w (from 0) onto the (w+1)-th allowed CPU after the caller's, when there are CPUs enough
 * for the caller and `threads - 1` workers each to have its own; else left to the scheduler.
 * Returns the CPU, or -1. */
static int pin_worker(pthread_t t, int w, int threads) {
  cpu_set_t allowed, one;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < threads) return -1;
  int cpus[CPU_SETSIZE], n = 0, at = 0, me = sched_getcpu();
  for (int c = 0; c < CPU_SETSIZE; c++) {
    if (!CPU_ISSET(c, &allowed)) continue;
    if (c == me) at = n;
    cpus[n++] = c;
  }
  CPU_ZERO(&one);
  CPU_SET(cpus[(at + 1 + w) % n], &one);
  return pthread_setaffinity_np(t, sizeof one, &one) == 0 ? cpus[(at + 1 + w) % n] : -1;
}

/* The caller is not pinned: when it runs on a CPU one of its workers is pinned to, the workers move to
 * the CPUs after the caller's again, or that worker's chunk waits for the caller's core. The scheduler
 * migrates the caller; and each library has a pool of its own, pinned after wherever the caller sat when
 * that pool started, so two models in one process (a benchmark's default and tuned builds) may put their
 * workers on different CPUs. Costs a sched_getcpu a loop (the vDSO's, nanoseconds). */
static void keep_off_caller(int used) {
  int me = sched_getcpu();
  for (int w = 0; w < used; w++) {
    if (P.cpu[w] == me) {
      for (int v = 0; v < P.workers; v++) P.cpu[v] = pin_worker(P.thread[v], v, P.workers + 1);
      return;
    }
  }
}

static void start_workers(int wanted) {
  if (wanted > TF_MAX_WORKERS) wanted = TF_MAX_WORKERS;
  if (P.workers == 0) P.spin_ns = spin_from_env();
  int pin = pin_from_env();
  while (P.workers < wanted) {
    pthread_t t;
    void *gen = (void *)(uintptr_t)atomic_load(&P.gen);
    if (pthread_create(&t, NULL, worker_main, gen) != 0) return; /* fewer helpers: the caller does more */
    char name[16];
    snprintf(name, sizeof name, "tunaflow-w%u", (unsigned char)(P.workers + 1));
    pthread_setname_np(t, name);
    P.thread[P.workers] = t;
    P.cpu[P.workers] = pin ? pin_worker(t, P.workers, wanted + 1) : -1;
    pthread_detach(t);
    P.workers++;
  }
}

/* After fork() only the forking thread exists: the child starts its own workers when needed. */
static void after_fork_in_child(void) {
  pthread_mutex_init(&P.busy, NULL);
  P.workers = 0;
  atomic_store(&P.sleepers, 0);
}

static pthread_once_t fork_hook = PTHREAD_ONCE_INIT;
static void install_fork_hook(void) { pthread_atfork(NULL, NULL, after_fork_in_child); }

void tf_parallel_for(tf_body fn, void *args, int64_t extent, int64_t threads) {
  if (threads > extent) threads = extent;
  if (threads > TF_MAX_WORKERS + 1) threads = TF_MAX_WORKERS + 1;
  if (threads <= 1 || pthread_mutex_trylock(&P.busy) != 0) {
    fn(args, 0, extent);
    return;
  }
  pthread_once(&fork_hook, install_fork_hook);
  start_workers((int)threads - 1);
  keep_off_caller((int)threads - 1);
  P.fn = fn;
  P.args = args;
  P.extent = extent;
  P.chunks = threads;
  atomic_store(&P.done, 0);
  uint32_t g = atomic_load(&P.gen) + 1;
  atomic_store(&P.ticket, (uint64_t)g << 32 | (uint64_t)threads << 16);
  atomic_store(&P.gen, g);
  if (atomic_load(&P.sleepers) > 0) syscall(SYS_futex, &P.gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
  int64_t c;
  while (claim(g, &c)) run_chunk(c);
  for (int i = 1; atomic_load_explicit(&P.done, memory_order_acquire) < threads; i++) {
    relax();
    if ((i & 1023) == 0) sched_yield(); /* a worker mid-chunk lost its core: let it have ours */
  }
  pthread_mutex_unlock(&P.busy);
}
