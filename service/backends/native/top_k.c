/*
 * Each row's k largest logits in one pass, for the batched sampler.
 *
 * numpy finds them in two passes and a partition (service/backends/batch_sampling.py:
 * strided block maxima, then the best blocks), about three times an argmax on the
 * GPU host, which kept sampled decoding under 0.85 of greedy at 32-128 streams.
 * Here one pass, in SIMD, takes the maximum of each chunk of 64 columns; the k-th
 * largest of those maxima is a threshold that at least k values reach, and only
 * chunks whose maximum reaches it (about k of them) are read again. The rest is
 * selections over a few thousand numbers, so a row costs about what reading it does.
 *
 * No Python headers: loaded with ctypes, which lets go of the GIL during the call,
 * so row blocks on several threads run in parallel.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Buffer slots per kept candidate: a compaction every (SLACK - 1) * k insertions. */
enum { SLACK = 8 };
/* Columns per chunk whose maximum the first pass takes. */
enum { CHUNK = 64 };



static void swap_pair(float *values, int32_t *ids, int64_t a, int64_t b) {
    float value = values[a];
    int32_t id = ids[a];
    values[a] = values[b];
    ids[a] = ids[b];
    values[b] = value;
    ids[b] = id;
}

/* Reorder values[0..count) so that its k largest come first (in no order). */
static void select_largest(float *values, int32_t *ids, int64_t count, int64_t k) {
    int64_t low = 0, high = count - 1;
    while (low < high) {
        /* Median of three as the pivot, moved to `high`. */
        int64_t middle = low + (high - low) / 2;
        if (values[middle] < values[low]) swap_pair(values, ids, middle, low);
        if (values[high] < values[low]) swap_pair(values, ids, high, low);
        if (values[middle] < values[high]) swap_pair(values, ids, middle, high);
        float pivot = values[high];
        /* Larger than the pivot to the left. */
        int64_t store = low;
        for (int64_t i = low; i < high; i++) {
            if (values[i] > pivot) swap_pair(values, ids, i, store++);
        }
        swap_pair(values, ids, store, high);
        if (store == k - 1 || store == k) return;
        if (store < k) low = store + 1; else high = store - 1;
    }
}

/*
 * maxima[c] = the largest of line[c * CHUNK ... (c + 1) * CHUNK), NaNs ignored: the one
 * pass over the whole row. In SIMD: AVX where the CPU has it (x86-64 builds are
 * portable, so it is chosen at run time), SSE otherwise on x86-64, and whatever the
 * compiler makes of the plain loop elsewhere.
 */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

__attribute__((target("avx"))) static void chunk_maxima_avx(const float *line, int64_t chunks,
                                                            float *maxima) {
    for (int64_t c = 0; c < chunks; c++) {
        const float *at = line + c * CHUNK;
        __m256 a = _mm256_set1_ps(-INFINITY), b = a;
        for (int i = 0; i < CHUNK; i += 16) {
            /* max(x, best) keeps best when x is NaN. */
            a = _mm256_max_ps(_mm256_loadu_ps(at + i), a);
            b = _mm256_max_ps(_mm256_loadu_ps(at + i + 8), b);
        }
        __m256 both = _mm256_max_ps(a, b);
        __m128 half = _mm_max_ps(_mm256_castps256_ps128(both), _mm256_extractf128_ps(both, 1));
        half = _mm_max_ps(half, _mm_movehl_ps(half, half));
        half = _mm_max_ss(half, _mm_shuffle_ps(half, half, 1));
        maxima[c] = _mm_cvtss_f32(half);
    }
}

static void chunk_maxima_sse(const float *line, int64_t chunks, float *maxima) {
    for (int64_t c = 0; c < chunks; c++) {
        const float *at = line + c * CHUNK;
        __m128 a = _mm_set1_ps(-INFINITY), b = a;
        for (int i = 0; i < CHUNK; i += 8) {
            a = _mm_max_ps(_mm_loadu_ps(at + i), a);
            b = _mm_max_ps(_mm_loadu_ps(at + i + 4), b);
        }
        __m128 half = _mm_max_ps(a, b);
        half = _mm_max_ps(half, _mm_movehl_ps(half, half));
        half = _mm_max_ss(half, _mm_shuffle_ps(half, half, 1));
        maxima[c] = _mm_cvtss_f32(half);
    }
}

static void chunk_maxima(const float *line, int64_t chunks, float *maxima) {
    static int has_avx = -1;
    if (has_avx < 0) has_avx = __builtin_cpu_supports("avx");
    if (has_avx) chunk_maxima_avx(line, chunks, maxima);
    else chunk_maxima_sse(line, chunks, maxima);
}
#else
static void chunk_maxima(const float *line, int64_t chunks, float *maxima) {
    for (int64_t c = 0; c < chunks; c++) {
        const float *at = line + c * CHUNK;
        float best = -INFINITY;
        for (int i = 0; i < CHUNK; i++) best = at[i] > best ? at[i] : best;
        maxima[c] = best;
    }
}
#endif

/* The smallest of values[0..k). */
static float smallest(const float *values, int64_t k) {
    float least = values[0];
    for (int64_t i = 1; i < k; i++) {
        if (values[i] < least) least = values[i];
    }
    return least;
}

/* A buffer of candidates that keeps at least the k best of what it is offered. */
typedef struct {
    float *values;
    int32_t *ids;
    int64_t count, k;
    float threshold;
    int strict; /* after a compaction, only values above the threshold enter */
} Keeper;

static void offer(Keeper *keeper, const float *line, int64_t begin, int64_t end) {
    for (int64_t column = begin; column < end; column++) {
        float value = line[column];
        if (value > keeper->threshold || (!keeper->strict && value == keeper->threshold)) {
            keeper->values[keeper->count] = value;
            keeper->ids[keeper->count] = (int32_t)column;
            if (++keeper->count == SLACK * keeper->k) {
                select_largest(keeper->values, keeper->ids, keeper->count, keeper->k);
                keeper->count = keeper->k;
                keeper->threshold = smallest(keeper->values, keeper->k);
                keeper->strict = 1;
            }
        }
    }
}

static void sift_down(float *heap, int64_t size, int64_t at) {
    for (;;) {
        int64_t least = at, left = 2 * at + 1, right = left + 1;
        if (left < size && heap[left] < heap[least]) least = left;
        if (right < size && heap[right] < heap[least]) least = right;
        if (least == at) return;
        float value = heap[at];
        heap[at] = heap[least];
        heap[least] = value;
        at = least;
    }
}

/* The k-th largest of values[0..count), count > k, by a min-heap of the k largest so
   far: one comparison for most values, where a selection would move them all. */
static float kth_largest(const float *values, int64_t count, int64_t k, float *heap) {
    memcpy(heap, values, k * sizeof *heap);
    for (int64_t i = k / 2 - 1; i >= 0; i--) sift_down(heap, k, i);
    for (int64_t i = k; i < count; i++) {
        if (values[i] > heap[0]) {
            heap[0] = values[i];
            sift_down(heap, k, 0);
        }
    }
    return heap[0];
}

/*
 * For each of `rows` rows of `columns` floats (rows `stride` floats apart), the ids
 * and values of its k largest values, in no order: row r's go to out_ids[r * k ...]
 * and out_values[r * k ...]. Requires 1 <= k <= columns. `scratch_values` and
 * `scratch_ids` hold SLACK * k entries each, `maxima` columns / CHUNK + 1. Of values equal to the k-th largest, any may be the ones
 * kept (as with llama.cpp's own top-k); a row holding NaNs gets no promise.
 */
void top_k_rows(const float *logits, int64_t rows, int64_t columns, int64_t stride, int64_t k,
                int64_t *out_ids, float *out_values, float *scratch_values, int32_t *scratch_ids,
                float *maxima) {
    const int64_t chunks = columns / CHUNK;
    for (int64_t row = 0; row < rows; row++) {
        const float *line = logits + row * stride;
        Keeper keeper = {scratch_values, scratch_ids, 0, k, -INFINITY, 0};
        if (chunks > k) {
            chunk_maxima(line, chunks, maxima);
            /* At least k values reach it: the k chunks' own maxima. */
            keeper.threshold = kth_largest(maxima, chunks, k, scratch_values);
            for (int64_t c = 0; c < chunks; c++) {
                if (maxima[c] >= keeper.threshold) offer(&keeper, line, c * CHUNK, (c + 1) * CHUNK);
            }
            offer(&keeper, line, chunks * CHUNK, columns);
        } else {  /* a short row: offer it all, the first k unconditionally */
            for (int64_t column = 0; column < k; column++) {
                scratch_values[column] = line[column];
                scratch_ids[column] = (int32_t)column;
            }
            keeper.count = k;
            keeper.threshold = smallest(scratch_values, k);
            offer(&keeper, line, k, columns);
        }
        if (keeper.count > k) select_largest(scratch_values, scratch_ids, keeper.count, k);
        for (int64_t i = 0; i < k; i++) {
            out_ids[row * k + i] = scratch_ids[i];
            out_values[row * k + i] = scratch_values[i];
        }
    }
}
