/* Stub for the layout check: nccl.h includes it, uses nothing from it. */
