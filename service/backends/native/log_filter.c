/*
 * A llama.cpp log callback that runs without Python.
 *
 * llama.cpp hands every log line to one callback. A callback written in Python
 * takes the GIL for each line, even one it then drops, and the CUDA backend logs
 * a DEBUG line on every decode step ("CUDA Graph id ... reused"). At 64 streams
 * that was about 7% of the model thread, contended with the event loop. This
 * filter drops what is below `lowest_level` (and continuation lines) in C, and
 * passes the rest on to the callback given to log_filter_set.
 *
 * No Python headers: it is loaded with ctypes. The signature is ggml_log_callback.
 */
#include <stddef.h>

typedef void (*log_callback)(int level, const char *text, void *user_data);

enum { GGML_LOG_LEVEL_ERROR = 4 };  /* ggml.h: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 */

static log_callback forward_to = NULL;
static int lowest_level = GGML_LOG_LEVEL_ERROR + 1;

void log_filter_set(log_callback forward, int lowest) {
    forward_to = forward;
    lowest_level = lowest;
}

void log_filter(int level, const char *text, void *user_data) {
    log_callback forward = forward_to;
    if (forward != NULL && level >= lowest_level && level <= GGML_LOG_LEVEL_ERROR) {
        forward(level, text, user_data);
    }
}
