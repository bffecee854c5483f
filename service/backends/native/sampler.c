/*
 * The batched sampler's draw, whole, for a block of rows of a step's logits.
 *
 * service/backends/batch_sampling.py describes the draw and does it in numpy; this
 * does the same, row by row, without Python: at 32 streams on an H200 a step's
 * forward pass takes about 5 ms, and numpy's fixed costs (a dozen calls on small
 * arrays, per step, plus a wrapper per block of rows) were a fifth of that.
 *
 * A row costs about what reading it does. One pass, in SIMD, takes the maximum of
 * each chunk of 64 columns; the k-th largest of those maxima is a threshold that at
 * least k values reach (the k chunks' own maxima), and only chunks whose maximum
 * reaches it (about k of them) are read again. What follows (the repetition
 * penalty, the sort, top-k, top-p, min-p, the temperature and the draw) works on
 * those k candidates.
 *
 * No Python headers: loaded with ctypes, which lets go of the GIL during the call,
 * so blocks of rows on several threads run in parallel.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Buffer slots per kept candidate: a compaction every (SLACK - 1) * k insertions. */
enum { SLACK = 8 };
/* Columns per chunk whose maximum the first pass takes. */
enum { CHUNK = 64 };
/* A row's settings: a row of doubles, in this order (service/backends/native/sampler.py). */
enum {
    TEMPERATURE,
    TOP_K,
    TOP_P,
    MIN_P,
    REPEAT_PENALTY,
    PRESENCE_PENALTY,
    FREQUENCY_PENALTY,
    SEED,
    DRAW,
    SETTINGS
};

typedef struct {
    float value;
    int32_t id;
} Candidate;

/* Reorder items[0..count) so that its k largest values come first (in no order). */
static void select_largest(Candidate *items, int64_t count, int64_t k) {
    int64_t low = 0, high = count - 1;
    while (low < high) {
        /* Median of three as the pivot, moved to `high`. */
        int64_t middle = low + (high - low) / 2;
        Candidate swap;
#define SWAP(a, b) (swap = items[a], items[a] = items[b], items[b] = swap)
        if (items[middle].value < items[low].value) SWAP(middle, low);
        if (items[high].value < items[low].value) SWAP(high, low);
        if (items[middle].value < items[high].value) SWAP(middle, high);
        float pivot = items[high].value;
        /* Larger than the pivot to the left. */
        int64_t store = low;
        for (int64_t i = low; i < high; i++) {
            if (items[i].value > pivot) {
                SWAP(i, store);
                store++;
            }
        }
        SWAP(store, high);
#undef SWAP
        if (store == k - 1 || store == k) return;
        if (store < k) low = store + 1; else high = store - 1;
    }
}

/* items[0..count) from the largest value down; insertion sort, as count is top_k. */
static void sort_descending(Candidate *items, int64_t count) {
    for (int64_t i = 1; i < count; i++) {
        Candidate item = items[i];
        int64_t j = i;
        for (; j > 0 && items[j - 1].value < item.value; j--) items[j] = items[j - 1];
        items[j] = item;
    }
}

/* A buffer of candidates that keeps at least the k best of what it is offered. */
typedef struct {
    Candidate *items;
    int64_t count, k;
    float threshold;
    int strict; /* after a compaction, only values above the threshold enter */
} Keeper;

static float smallest(const Candidate *items, int64_t k) {
    float least = items[0].value;
    for (int64_t i = 1; i < k; i++) {
        if (items[i].value < least) least = items[i].value;
    }
    return least;
}

static void keep(Keeper *keeper, float value, int64_t column) {
    if (!(value > keeper->threshold || (!keeper->strict && value == keeper->threshold))) return;
    keeper->items[keeper->count].value = value;
    keeper->items[keeper->count].id = (int32_t)column;
    if (++keeper->count == SLACK * keeper->k) {
        select_largest(keeper->items, keeper->count, keeper->k);
        keeper->count = keeper->k;
        keeper->threshold = smallest(keeper->items, keeper->k);
        keeper->strict = 1;
    }
}

static void offer_plain(Keeper *keeper, const float *line, int64_t begin, int64_t end) {
    for (int64_t column = begin; column < end; column++) keep(keeper, line[column], column);
}

/*
 * The pieces that read whole rows, in SIMD: AVX where the CPU has it (x86-64 builds
 * are portable, so it is chosen at run time), SSE otherwise on x86-64, and whatever
 * the compiler makes of the plain loops elsewhere.
 *
 * chunk_maxima: maxima[c] = the largest of line[c * CHUNK ... (c + 1) * CHUNK), NaNs
 * ignored. count_reaching: how many of values[0..count) are at least `threshold`.
 * offer_chunk: the chunk's values that reach the keeper's threshold, to the keeper.
 */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

__attribute__((target("avx"))) static void chunk_maxima_avx(const float *line, int64_t chunks,
                                                            float *maxima) {
    for (int64_t c = 0; c < chunks; c++) {
        const float *at = line + c * CHUNK;
        __m256 a = _mm256_set1_ps(-INFINITY), b = a, d = a, e = a;
        for (int i = 0; i < CHUNK; i += 32) {
            /* max(x, best) keeps best when x is NaN. */
            a = _mm256_max_ps(_mm256_loadu_ps(at + i), a);
            b = _mm256_max_ps(_mm256_loadu_ps(at + i + 8), b);
            d = _mm256_max_ps(_mm256_loadu_ps(at + i + 16), d);
            e = _mm256_max_ps(_mm256_loadu_ps(at + i + 24), e);
        }
        __m256 all = _mm256_max_ps(_mm256_max_ps(a, b), _mm256_max_ps(d, e));
        __m128 half = _mm_max_ps(_mm256_castps256_ps128(all), _mm256_extractf128_ps(all, 1));
        half = _mm_max_ps(half, _mm_movehl_ps(half, half));
        half = _mm_max_ss(half, _mm_shuffle_ps(half, half, 1));
        maxima[c] = _mm_cvtss_f32(half);
    }
}

__attribute__((target("avx"))) static int64_t count_reaching_avx(const float *values,
                                                                int64_t count, float threshold) {
    const __m256 bar = _mm256_set1_ps(threshold);
    int64_t reaching = 0, i = 0;
    for (; i + 8 <= count; i += 8) {
        __m256 reached = _mm256_cmp_ps(_mm256_loadu_ps(values + i), bar, _CMP_GE_OQ);
        reaching += __builtin_popcount(_mm256_movemask_ps(reached));
    }
    for (; i < count; i++) reaching += values[i] >= threshold;
    return reaching;
}

__attribute__((target("avx"))) static void offer_chunk_avx(Keeper *keeper, const float *line,
                                                           int64_t begin) {
    for (int i = 0; i < CHUNK; i += 8) {
        __m256 threshold = _mm256_set1_ps(keeper->threshold);
        __m256 values = _mm256_loadu_ps(line + begin + i);
        /* What keep() takes: above the threshold, or at it until the first compaction. */
        __m256 taken = keeper->strict ? _mm256_cmp_ps(values, threshold, _CMP_GT_OQ)
                                      : _mm256_cmp_ps(values, threshold, _CMP_GE_OQ);
        for (int mask = _mm256_movemask_ps(taken); mask; mask &= mask - 1) {
            int64_t column = begin + i + __builtin_ctz(mask);
            keep(keeper, line[column], column);
        }
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

static int64_t count_reaching_plain(const float *values, int64_t count, float threshold) {
    int64_t reaching = 0;
    for (int64_t i = 0; i < count; i++) reaching += values[i] >= threshold;
    return reaching;
}

static int has_avx(void) {
    static int known = -1;
    if (known < 0) known = __builtin_cpu_supports("avx");
    return known;
}

static void chunk_maxima(const float *line, int64_t chunks, float *maxima) {
    if (has_avx()) chunk_maxima_avx(line, chunks, maxima);
    else chunk_maxima_sse(line, chunks, maxima);
}

static int64_t count_reaching(const float *values, int64_t count, float threshold) {
    return has_avx() ? count_reaching_avx(values, count, threshold)
                     : count_reaching_plain(values, count, threshold);
}

static void offer_chunk(Keeper *keeper, const float *line, int64_t begin) {
    if (has_avx()) offer_chunk_avx(keeper, line, begin);
    else offer_plain(keeper, line, begin, begin + CHUNK);
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

static int64_t count_reaching(const float *values, int64_t count, float threshold) {
    int64_t reaching = 0;
    for (int64_t i = 0; i < count; i++) reaching += values[i] >= threshold;
    return reaching;
}

static void offer_chunk(Keeper *keeper, const float *line, int64_t begin) {
    offer_plain(keeper, line, begin, begin + CHUNK);
}
#endif

/*
 * A threshold that at least k of the chunk maxima reach (so at least k values of the
 * row), and not many more than k: the chunks to read again. Bisection on the value,
 * each step a SIMD count over the maxima (a few kilobytes, in cache): about a
 * microsecond a row, where keeping a heap of the k largest maxima took five.
 */
static float chunk_threshold(const float *maxima, int64_t chunks, int64_t k) {
    float best = -INFINITY;
    for (int64_t c = 0; c < chunks; c++) best = maxima[c] > best ? maxima[c] : best;
    /* low: reached by at least k; high: by fewer than k, or the best itself. */
    float high = best, low = best, gap = 1.0f;
    int64_t reaching = count_reaching(maxima, chunks, low);
    while (reaching < k) {
        high = low;
        low = best - gap;
        gap *= 4;
        if (!isfinite(low)) low = -INFINITY;
        reaching = count_reaching(maxima, chunks, low);
    }
    const int64_t enough = k + k / 4 + 8;
    for (int step = 0; step < 40 && reaching > enough && isfinite(low); step++) {
        float middle = low + (high - low) / 2;
        if (middle <= low || middle >= high) break;
        int64_t at_middle = count_reaching(maxima, chunks, middle);
        if (at_middle >= k) {
            low = middle;
            reaching = at_middle;
        } else {
            high = middle;
        }
    }
    return low;
}

/*
 * The k largest of line[0..columns) into items[0..k), in no order; returns how many
 * it found, k unless the row holds NaNs (never offered). `items` holds SLACK * k
 * entries, `maxima` columns / CHUNK.
 */
static int64_t row_top_k(const float *line, int64_t columns, int64_t k, Candidate *items,
                         float *maxima) {
    const int64_t chunks = columns / CHUNK;
    Keeper keeper = {items, 0, k, -INFINITY, 0};
    if (chunks > k) {
        chunk_maxima(line, chunks, maxima);
        keeper.threshold = chunk_threshold(maxima, chunks, k);
        for (int64_t c = 0; c < chunks; c++) {
            if (maxima[c] >= keeper.threshold) offer_chunk(&keeper, line, c * CHUNK);
        }
        offer_plain(&keeper, line, chunks * CHUNK, columns);
    } else {
        offer_plain(&keeper, line, 0, columns);
    }
    if (keeper.count > k) select_largest(items, keeper.count, k);
    return keeper.count < k ? keeper.count : k;
}

/* llama.cpp's penalties on the candidates that occur among the recent tokens: the
   logit divided by the repetition penalty when positive, multiplied when not, then
   lowered by the presence penalty and by the frequency penalty times the count (in
   float, as llama.cpp does; sampler.c is built without contracting to FMA, so the
   numpy draw gets the same values). */
static void penalize(Candidate *items, int64_t count, const int32_t *recent, int64_t window,
                     float repeat, float presence, float frequency) {
    for (int64_t i = 0; i < count; i++) {
        int occurrences = 0;
        for (int64_t j = 0; j < window; j++) occurrences += recent[j] == items[i].id;
        if (occurrences == 0) continue;
        float value = items[i].value;
        value = value <= 0 ? value * repeat : value / repeat;
        items[i].value = value - ((float)occurrences * frequency + presence);
    }
}

/* How many of the ranked candidates survive top-p and min-p (top-k already applied:
   `count` is at most top_k). Both read the probabilities at temperature 1. */
static int64_t kept_count(const Candidate *ranked, int64_t count, double top_p, double min_p,
                          double *weights) {
    const double best = ranked[0].value;
    int64_t kept = count;
    if (top_p < 1.0) {
        double total = 0;
        for (int64_t i = 0; i < count; i++) total += weights[i] = exp(ranked[i].value - best);
        double running = 0;
        for (int64_t i = 0; i < count; i++) {
            running += weights[i];
            if (running / total >= top_p) {
                kept = i + 1;
                break;
            }
        }
    }
    if (min_p > 0) {
        const double floor = best + log(min_p);
        int64_t above = 0;
        while (above < count && ranked[above].value >= floor) above++;
        if (above < kept) kept = above;
    }
    return kept < 1 ? 1 : kept;
}

/* Which of the first `kept` ranked candidates softmax(logit / temperature) draws for
   the number `uniform` in [0, 1). */
static int64_t draw(const Candidate *ranked, int64_t kept, double temperature, double uniform,
                    double *cumulative) {
    const double best = ranked[0].value;
    double running = 0;
    for (int64_t i = 0; i < kept; i++) {
        cumulative[i] = running += exp((ranked[i].value - best) / temperature);
    }
    const double target = uniform * running;
    for (int64_t i = 0; i < kept; i++) {
        if (cumulative[i] > target) return i;
    }
    return kept - 1;
}

/* The draw's number in [0, 1): SplitMix64 of (seed, draw index), the low 32 bits of
   each, as service.backends.batch_sampling.uniform computes it. */
static double uniform(double seed, double draw) {
    uint64_t z = ((uint64_t)seed & 0xFFFFFFFFu) << 32 | ((uint64_t)draw & 0xFFFFFFFFu);
    z += 0x9E3779B97F4A7C15u;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

/* The candidates a row's draw reads: its top_k, and the penalty window's worth more
   when a penalty applies (a penalized candidate may fall out of the top_k), at most
   `most`. */
static int64_t row_width(const double *own, int has_recent, int64_t window, int64_t most) {
    const int greedy = own[TEMPERATURE] == 0;
    const int64_t top_k = greedy ? 1 : (int64_t)own[TOP_K];
    const int penalized = has_recent && ((float)own[REPEAT_PENALTY] != 1.0f ||
                                         (float)own[PRESENCE_PENALTY] != 0.0f ||
                                         (float)own[FREQUENCY_PENALTY] != 0.0f);
    int64_t width = top_k + (penalized ? window : 0);
    if (width > most) width = most;
    return width < 1 ? 1 : width;
}

/* The token a row draws from its `found` candidates (penalties not yet applied): the
   penalties, top-k, the sort, top-p, min-p, the temperature and the seeded draw. A row
   without candidates (all NaN) gets token 0. */
static int64_t finish_row(Candidate *items, int64_t found, const double *own,
                          const int32_t *recent, int64_t window, double *work) {
    if (found == 0) return 0;
    const int greedy = own[TEMPERATURE] == 0;
    const int64_t top_k = greedy ? 1 : (int64_t)own[TOP_K];
    const float repeat = (float)own[REPEAT_PENALTY];
    const float presence = (float)own[PRESENCE_PENALTY];
    const float frequency = (float)own[FREQUENCY_PENALTY];
    if (recent != NULL && (repeat != 1.0f || presence != 0.0f || frequency != 0.0f)) {
        penalize(items, found, recent, window, repeat, presence, frequency);
    }
    int64_t ranked = top_k < found ? top_k : found;
    if (ranked < found) select_largest(items, found, ranked);
    sort_descending(items, ranked);
    int64_t pick = 0;
    if (!greedy) {
        int64_t kept = kept_count(items, ranked, own[TOP_P], own[MIN_P], work);
        pick = draw(items, kept, own[TEMPERATURE], uniform(own[SEED], own[DRAW]), work);
    }
    return items[pick].id;
}

/*
 * A whole row's draw, for a row without top-k (top_k 0): top-p and min-p over the
 * whole vocabulary, in passes over the row whose cost does not depend on how many
 * tokens they keep, where sorting the vocabulary (llama.cpp's chain) costs most on a
 * flat distribution, whose nucleus is most of it.
 *
 * The row's probabilities at temperature 1 are w = exp(logit - max), as floats,
 * summed in double (a token more than 87 below the maximum weighs nothing, as no
 * float holds its weight). Top-p keeps the fewest most probable tokens whose mass
 * reaches top_p of the total. The weight where that happens is found from the
 * weights' bits (positive floats order as their bits do), 12, then 12, then the last
 * 7 at a time: each level sums the mass per bucket of its bits and walks the buckets
 * from the heaviest down, and the next level reads only the tokens of the bucket
 * where the mass crosses. Every token above that weight is kept, and of those at
 * exactly it as many as the mass still needs, in the order of their ids. Min-p then
 * keeps the tokens whose logit is at least max + log(min_p). The draw is
 * softmax(logit / temperature) over the kept tokens, walked in id order: the sorted
 * walk's distribution, and the same token for the same seed and draw wherever the
 * row is drawn.
 */
enum { LEVEL_BUCKETS = 4096 };

typedef struct {
    float *values;   /* the row's logits, penalized; then the kept tokens' draw weights */
    float *weights;  /* exp(logit - max) */
    int32_t *picked; /* the ids a level of the top-p search reads */
    double mass[LEVEL_BUCKETS];
} WholeRow;

static uint32_t bits_of(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

/* The penalties on each distinct recent token of a whole row (see penalize). */
static void penalize_row(float *values, int64_t columns, const int32_t *recent, int64_t window,
                         float repeat, float presence, float frequency) {
    for (int64_t j = 0; j < window; j++) {
        const int32_t id = recent[j];
        if (id < 0 || id >= columns) continue;
        int seen = 0, occurrences = 0;
        for (int64_t i = 0; i < window; i++) {
            seen |= i < j && recent[i] == id;
            occurrences += recent[i] == id;
        }
        if (seen) continue;
        float value = values[id];
        value = value <= 0 ? value * repeat : value / repeat;
        values[id] = value - ((float)occurrences * frequency + presence);
    }
}

/*
 * One level of the top-p search over the `count` ids in picked[]: the bucket of
 * (bits >> shift) & mask in which the mass, walked from the heaviest bucket down with
 * `*above` already counted, reaches `target`. Leaves that bucket's ids in picked[] and
 * returns how many; *above gains the mass of the heavier buckets, *key is the bucket.
 */
static int64_t crossing_bucket(WholeRow *row, int64_t count, int shift, uint32_t mask,
                               double target, double *above, uint32_t *key) {
    memset(row->mass, 0, sizeof row->mass);
    for (int64_t i = 0; i < count; i++) {
        const float w = row->weights[row->picked[i]];
        row->mass[(bits_of(w) >> shift) & mask] += w;
    }
    uint32_t bucket = mask;
    while (bucket > 0 && *above + row->mass[bucket] < target) *above += row->mass[bucket--];
    *key = bucket;
    int64_t left = 0;
    for (int64_t i = 0; i < count; i++) {
        const int32_t id = row->picked[i];
        if (((bits_of(row->weights[id]) >> shift) & mask) == bucket) row->picked[left++] = id;
    }
    return left;
}

/* Top-p's cut: the kept tokens weigh more than *cut, or exactly it, of which the
   first *at_cut in id order (-1: no top-p, every token is kept). row->mass holds the
   first level's mass per bucket of the weights' top 12 bits, summed over the row. */
static void top_p_cut(WholeRow *row, int64_t columns, double top_p, double total,
                      uint32_t *cut, int64_t *at_cut) {
    *cut = 0;
    *at_cut = -1;
    if (top_p >= 1.0) return;
    const double target = top_p * total;
    double above = 0;
    uint32_t high = 0xFFF, middle, low;
    while (high > 0 && above + row->mass[high] < target) above += row->mass[high--];
    int64_t count = 0;
    for (int64_t i = 0; i < columns; i++) {
        const float w = row->weights[i];
        if (w > 0 && bits_of(w) >> 19 == high) row->picked[count++] = (int32_t)i;
    }
    count = crossing_bucket(row, count, 7, 0xFFF, target, &above, &middle);
    count = crossing_bucket(row, count, 0, 0x7F, target, &above, &low);
    *cut = high << 19 | middle << 7 | low;
    float weight;
    memcpy(&weight, cut, sizeof weight);
    int64_t needed = weight > 0 ? (int64_t)ceil((target - above) / weight) : count;
    if (needed > count) needed = count;
    *at_cut = needed < 1 ? 1 : needed;
}

static WholeRow *new_whole_row(int64_t columns) {
    WholeRow *row = malloc(sizeof *row);
    if (row == NULL) return NULL;
    row->values = malloc(columns * sizeof(float));
    row->weights = malloc(columns * sizeof(float));
    row->picked = malloc(columns * sizeof(int32_t));
    if (row->values && row->weights && row->picked) return row;
    free(row->values);
    free(row->weights);
    free(row->picked);
    free(row);
    return NULL;
}

static void free_whole_row(WholeRow *row) {
    if (row == NULL) return;
    free(row->values);
    free(row->weights);
    free(row->picked);
    free(row);
}

static int64_t whole_row_draw(const float *line, int64_t columns, const double *own,
                              const int32_t *recent, int64_t window, WholeRow *row) {
    float *values = row->values, *weights = row->weights;
    memcpy(values, line, columns * sizeof(float));
    const float repeat = (float)own[REPEAT_PENALTY];
    const float presence = (float)own[PRESENCE_PENALTY];
    const float frequency = (float)own[FREQUENCY_PENALTY];
    if (recent != NULL && (repeat != 1.0f || presence != 0.0f || frequency != 0.0f)) {
        penalize_row(values, columns, recent, window, repeat, presence, frequency);
    }
    int64_t best_id = -1;
    float best = -INFINITY;
    for (int64_t i = 0; i < columns; i++) {
        if (values[i] > best) {
            best = values[i];
            best_id = i;
        }
    }
    if (best_id < 0) return 0; /* no number in the row: NaNs, or only -inf */
    const float lowest = best - 87.0f;
    for (int64_t i = 0; i < columns; i++) {
        const float value = values[i]; /* a NaN fails the comparison: weight 0 */
        weights[i] = value >= lowest ? expf(value - best) : 0.0f;
    }
    double total = 0;
    memset(row->mass, 0, sizeof row->mass);
    for (int64_t i = 0; i < columns; i++) {
        const float w = weights[i];
        total += w;
        row->mass[bits_of(w) >> 19] += w;
    }
    uint32_t cut;
    int64_t at_cut;
    top_p_cut(row, columns, own[TOP_P], total, &cut, &at_cut);
    const float floor = own[MIN_P] > 0 ? best + (float)log(own[MIN_P]) : -INFINITY;
    /* values[i] becomes the kept tokens' weight at the temperature, -1 for the rest. */
    const float temperature = (float)own[TEMPERATURE];
    double running = 0;
    int64_t seen_at_cut = 0;
    for (int64_t i = 0; i < columns; i++) {
        const uint32_t bits = bits_of(weights[i]);
        int kept = weights[i] > 0 && bits >= cut && values[i] >= floor;
        if (kept && bits == cut && at_cut >= 0) kept = seen_at_cut++ < at_cut;
        values[i] = kept ? expf((values[i] - best) / temperature) : -1.0f;
        if (kept) running += values[i];
    }
    const double target = uniform(own[SEED], own[DRAW]) * running;
    double walked = 0;
    int64_t last = best_id;
    for (int64_t i = 0; i < columns; i++) {
        if (values[i] <= 0) continue;
        walked += values[i];
        last = i;
        if (walked > target) return i;
    }
    return last;
}

/*
 * One token for each of `rows` rows of `columns` logits (rows `stride` floats apart)
 * into tokens[row], by that row's `settings` (SETTINGS doubles a row: temperature, 0
 * for greedy; top_k, at least 1, or 0 for none: whole_row_draw; top_p; min_p; the
 * repetition, presence and frequency penalties; the request's seed and which of its
 * draws this is).
 * `recent` holds `window` token ids a row (-1 for none): the tokens the penalties
 * apply to; NULL when no row has a penalty. `widest` is the largest top_k of any
 * row. A row of NaNs gets token 0. Returns 0, or -1 when out of memory.
 */
int sample_rows(const float *logits, int64_t rows, int64_t columns, int64_t stride,
                const double *settings, const int32_t *recent, int64_t window, int64_t widest,
                int64_t *tokens) {
    const int64_t most = (widest + (recent ? window : 0) < columns)
                             ? widest + (recent ? window : 0)
                             : columns;
    char *scratch = malloc(SLACK * most * sizeof(Candidate) + most * sizeof(double) +
                           (columns / CHUNK + 1) * sizeof(float));
    if (!scratch) return -1;
    Candidate *items = (Candidate *)scratch;
    double *work = (double *)(items + SLACK * most);
    float *maxima = (float *)(work + most);
    WholeRow *whole = NULL; /* made for the first row without top-k */
    for (int64_t row = 0; row < rows; row++) {
        const double *own = settings + row * SETTINGS;
        const int32_t *own_recent = recent ? recent + row * window : NULL;
        if (own[TOP_K] == 0 && own[TEMPERATURE] != 0) {
            if (whole == NULL && (whole = new_whole_row(columns)) == NULL) {
                free(scratch);
                return -1;
            }
            tokens[row] = whole_row_draw(logits + row * stride, columns, own, own_recent,
                                         window, whole);
            continue;
        }
        int64_t width = row_width(own, recent != NULL, window, most);
        int64_t found = row_top_k(logits + row * stride, columns, width, items, maxima);
        tokens[row] = finish_row(items, found, own, own_recent, window, work);
    }
    free_whole_row(whole);
    free(scratch);
    return 0;
}

/*
 * sample_rows for rows whose best candidates were found elsewhere (in llama.cpp's
 * graph: graph_sampler.c): row r's `count` candidates are ids[r * count ...] with
 * their logits values[r * count ...], the row's `count` largest, in no order. The
 * penalties only lower a logit, so the row's top_k best after them are among its
 * top_k + window best before; with `count` at least that, the token is the one
 * sample_rows draws from the whole row. Returns 0, or -1 when out of memory.
 */
int sample_candidates(const int32_t *ids, const float *values, int64_t rows, int64_t count,
                      const double *settings, const int32_t *recent, int64_t window,
                      int64_t *tokens) {
    char *scratch = malloc(count * sizeof(Candidate) + count * sizeof(double));
    if (!scratch) return -1;
    Candidate *items = (Candidate *)scratch;
    double *work = (double *)(items + count);
    for (int64_t row = 0; row < rows; row++) {
        const double *own = settings + row * SETTINGS;
        int64_t found = 0;
        for (int64_t i = 0; i < count; i++) {
            float value = values[row * count + i];
            if (value != value) continue; /* NaN: never a candidate, as in row_top_k */
            items[found].value = value;
            items[found].id = ids[row * count + i];
            found++;
        }
        int64_t width = row_width(own, recent != NULL, window, found);
        if (width < found) select_largest(items, found, width);
        if (width < found) found = width;
        tokens[row] = finish_row(items, found, own, recent ? recent + row * window : NULL,
                                 window, work);
    }
    free(scratch);
    return 0;
}

/*
 * The k largest of line[0..columns) into ids[0..k) and values[0..k), in no order:
 * the candidates a grammar is tried on first (service/backends/llama_cpp/sampling.py).
 * Returns how many it found (fewer than k only when the row holds NaNs), or -1 when
 * out of memory.
 */
int64_t top_k_row(const float *line, int64_t columns, int64_t k, int32_t *ids, float *values) {
    if (k > columns) k = columns;
    if (k < 1) return 0;
    char *scratch = malloc(SLACK * k * sizeof(Candidate) + (columns / CHUNK + 1) * sizeof(float));
    if (!scratch) return -1;
    Candidate *items = (Candidate *)scratch;
    float *maxima = (float *)(items + SLACK * k);
    int64_t found = row_top_k(line, columns, k, items, maxima);
    for (int64_t i = 0; i < found; i++) {
        ids[i] = items[i].id;
        values[i] = items[i].value;
    }
    free(scratch);
    return found;
}
