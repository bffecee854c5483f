/*
 * llama.cpp's abort callback, reading a flag another thread sets.
 *
 * ggml's CPU backend asks the callback, between the nodes of a graph, whether to
 * stop; llama_decode then returns 2 and keeps nothing of the micro-batch it was in.
 * A callback written in Python would take the GIL at every node, hundreds of
 * times a forward pass, from threads that otherwise run without it: this one only
 * reads an int (service/backends/native/interrupt.py owns it).
 */
#include <stdbool.h>

bool step_interrupted(void *flag) {
    return __atomic_load_n((const int *)flag, __ATOMIC_RELAXED) != 0;
}
