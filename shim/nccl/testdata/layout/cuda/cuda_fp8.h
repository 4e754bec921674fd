/* Stub for the layout check: nccl.h 2.24-2.27 include it in C too, and use
 * nothing from it. */
