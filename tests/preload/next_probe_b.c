/* next_probe_b.c — the "next" definition for next_probe_a.c. */
int tagmem_probe_value(void) { return 2; }

int tagmem_probe_b_only(void) { return 3; }
