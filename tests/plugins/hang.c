/* Kernels that never return and never give up the GIL (called through ctypes.PyDLL), for the
   time-limit tests: neither a Python signal handler nor a Python watchdog thread ever runs again
   in their process. */
#include <sched.h>

/* a kernel stuck in a loop of its own: a busy loop in C */
void spin_forever(void) {
    volatile unsigned long counter = 0;
    for (;;) counter++;
}

/* a CUDA-like blocking wait: spin (yielding the CPU, as cudaDeviceScheduleYield does) on a
   completion flag in shared memory that the "device" never sets */
void wait_for_flag(volatile int *flag) {
    while (*flag == 0) sched_yield();
}
