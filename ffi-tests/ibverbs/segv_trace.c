/* segv_trace.c: an LD_PRELOAD library that prints where a process crashed, for test runs on a
 * machine without a debugger (scripts/ib-standin.sh preloads it into the libraries it runs
 * over the software verbs device). On SIGSEGV, SIGBUS, SIGILL, SIGFPE or SIGABRT it writes
 * to stderr one line with the signal and the faulting address, then one line per stack frame:
 *   SEGV_TRACE #<n> <object>+0x<offset> (<symbol>)
 * (the object's path and the offset to give `addr2line -e <object>`), then re-raises the
 * signal with its default action, so that the process still dies of it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void say(const char *line) {
  ssize_t n = write(2, line, strlen(line));
  (void)n;
}

static void on_fault(int sig, siginfo_t *info, void *ctx) {
  (void)ctx;
  char line[512];
  snprintf(line, sizeof line, "SEGV_TRACE pid %d: signal %d (%s) at address %p\n", (int)getpid(), sig,
           strsignal(sig), info ? info->si_addr : NULL);
  say(line);
  void *frames[64];
  int n = backtrace(frames, 64);
  for (int i = 0; i < n; i++) {
    Dl_info d;
    if (dladdr(frames[i], &d) && d.dli_fname) {
      snprintf(line, sizeof line, "SEGV_TRACE #%d %s+%#lx (%s)\n", i, d.dli_fname,
               (unsigned long)((uintptr_t)frames[i] - (uintptr_t)d.dli_fbase), d.dli_sname ? d.dli_sname : "?");
    } else {
      snprintf(line, sizeof line, "SEGV_TRACE #%d %p\n", i, frames[i]);
    }
    say(line);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  /* backtrace() loads libgcc on first use: do it now, not inside the handler. */
  void *warm[2];
  backtrace(warm, 2);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
  for (unsigned i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &sa, NULL);
}
