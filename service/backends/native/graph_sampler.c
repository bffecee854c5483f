/*
 * Sampling inside llama.cpp's graph, for a whole step at once.
 *
 * llama.cpp lets a sampler per sequence add operations to the forward pass
 * (llama.h, "backend sampling"), so that only what they produce is copied back
 * instead of every row's logits (128 rows of a 128k vocabulary are 64 MB a step).
 * Its own samplers each work on their sequence's row alone: 128 argmaxes of one
 * row each, one after another, where one argmax over all rows runs them in
 * parallel; and changing a sequence's sampler makes llama.cpp reserve its graphs
 * again, which a server whose requests come and go would pay every few steps.
 *
 * So every sequence id gets one of these, once, when the context is made, and
 * all of them share a plan the caller writes before each step: per sequence id,
 * what its row needs this step:
 *
 *   GS_HOST    nothing here: llama.cpp copies the row's logits, as without us
 *              (a grammar, top logprobs, settings the host draws from the whole row);
 *   GS_GREEDY  the row's argmax, from one argmax over every row of the step;
 *   GS_TOP     the row's `top` largest logits and their token ids, found for every
 *              row at once without sorting the vocabulary (build_top_candidates),
 *              for the host to finish the draw on (penalties,
 *              top-k, top-p, min-p, temperature and the seeded draw: sampler.c's
 *              sample_candidates, the same numbers as from the whole row);
 *   GS_ROW     the whole draw, for a row without top-k or penalties: only its token
 *              comes back (see build_row_draws, whose cost does not grow with how
 *              many tokens top-p keeps).
 *
 * The shared operations are made by the first sequence of the step that needs
 * each, on the tensor every row is a view of, and each sequence takes a view of
 * its own row of the result. Sequences not in the step still build their views
 * (llama.cpp keeps its graph's shape) but nothing of theirs is computed.
 *
 * A caution llama.cpp imposes: a graph is reused, unchanged, for a step of the
 * same shape as the last one, so a sequence whose mode changes must not take part
 * in a step shaped like the previous one (the backend holds it out for a step).
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

enum { GS_HOST = 0, GS_GREEDY = 1, GS_TOP = 2, GS_ROW = 3 };

/* A GS_ROW row's settings, as the caller writes them per sequence id: 1/temperature,
   top_p (above 1 for none), log(min_p) (-1e30 for none), then one number in [0, 1)
   for each round of the draw. */
enum { ROW_ROUNDS = 3 };
enum { RP_INVERSE_TEMPERATURE, RP_TOP_P, RP_LOG_MIN_P, RP_UNIFORM, ROW_PARAMS = RP_UNIFORM + ROW_ROUNDS };

typedef struct {
    int32_t sequences;
    uint8_t *modes; /* by sequence id, written by the caller before a step */
    int32_t top;    /* candidates per GS_TOP row */
    /* This graph's shared operations, made by the first sequence needing each. */
    struct ggml_tensor *source;
    struct ggml_tensor *argmax;
    struct ggml_tensor *top_ids;
    struct ggml_tensor *top_values;
    /* GS_ROW: the graph's settings input (ROW_PARAMS x rows), its tokens (one a row),
       and which sequence id each row of the graph is (-1: none drawn there). */
    struct ggml_tensor *row_inputs;
    struct ggml_tensor *row_tokens;
    int32_t *row_seq;
    float *row_params; /* ROW_PARAMS a sequence id, written by the caller */
    float *staging;    /* ROW_PARAMS a row, what row_inputs gets */
    /* row_inputs is written once a step (and again for a graph built within it). */
    uint64_t step, generation, written_step, written_generation;
} Plan;

typedef struct {
    Plan *plan;
    int32_t seq_id;
} Seat;

static const char *gs_name(const struct llama_sampler *smpl) {
    (void)smpl;
    return "service-graph-sampler";
}

/* Without the graph (llama_sampler_sample on the host): leave the choice to the caller. */
static void gs_apply(struct llama_sampler *smpl, llama_token_data_array *cur_p) {
    (void)smpl;
    (void)cur_p;
}

static void gs_free(struct llama_sampler *smpl) { free(smpl->ctx); }

static bool gs_backend_init(struct llama_sampler *smpl, ggml_backend_buffer_type_t buft,
                            uint32_t n_outputs_max_per_seq) {
    (void)smpl;
    (void)buft;
    return n_outputs_max_per_seq == 1; /* one row per sequence a step, as the backend plans */
}

static void gs_backend_reset(struct llama_sampler *smpl) {
    Plan *plan = ((Seat *)smpl->ctx)->plan;
    plan->source = NULL;
    plan->argmax = NULL;
    plan->top_ids = NULL;
    plan->top_values = NULL;
    plan->row_inputs = NULL;
    plan->row_tokens = NULL;
    plan->generation++;
    for (int32_t i = 0; i <= plan->sequences; i++) plan->row_seq[i] = -1;
}

/* A (1 x rows) column of the settings input: setting `which` of every row. */
static struct ggml_tensor *setting(struct ggml_context *ctx, struct ggml_tensor *inputs, int which) {
    struct ggml_tensor *column =
        ggml_view_2d(ctx, inputs, 1, inputs->ne[1], inputs->nb[1], (size_t)which * sizeof(float));
    return ggml_cont(ctx, column);
}

/* The logit of each row's token `index` (1 x rows, I32), as a (1 x rows) tensor. */
static struct ggml_tensor *logit_at(struct ggml_context *ctx, struct ggml_tensor *logits3,
                                    struct ggml_tensor *index) {
    struct ggml_tensor *picked = ggml_get_rows(ctx, logits3, index);
    return ggml_reshape_2d(ctx, picked, 1, logits3->ne[2]);
}

/*
 * The whole draw of every row of `all` (vocabulary x rows), by the settings in
 * plan->row_inputs: top-p and min-p at temperature 1 (as sampler.c reads them), the
 * draw from softmax(logit / temperature) over the tokens both keep. No sort: the
 * draw is by rejection, in passes over the rows that cost the same whatever top-p
 * keeps.
 *
 * Both filters keep every token above some logit, so a token is kept when its logit
 * is at least log(min_p) below the row's best and the mass (at temperature 1) of the
 * tokens above it is less than top_p. A round draws a token from the weights left
 * (inverse CDF in token id order, against that round's number) and keeps it if it
 * passes; if not, every token at or below it fails too, and the next round draws from
 * the tokens above it alone. The kept token's chances are then exactly the
 * renormalized weights over the kept set. Min-p is applied to the weights before the
 * first round, so a round fails only on top-p, with a chance of at most 1 - top_p
 * at temperatures up to 1 (sharpening moves mass into the kept set). After
 * ROW_ROUNDS failed rounds the row's best token is taken, which is always kept.
 * Returns each row's token (1 x rows, I32).
 */
static struct ggml_tensor *build_row_draws(struct ggml_context *ctx, struct ggml_tensor *all,
                                           struct ggml_tensor *inputs) {
    const int64_t vocabulary = all->ne[0], rows = all->ne[1];
    struct ggml_tensor *logits3 = ggml_reshape_3d(ctx, all, 1, vocabulary, rows);
    struct ggml_tensor *top_p = setting(ctx, inputs, RP_TOP_P);
    /* Probabilities at temperature 1 (the filters') and at the row's own (the draw's). */
    struct ggml_tensor *plain = ggml_soft_max(ctx, all);
    struct ggml_tensor *scaled =
        ggml_soft_max(ctx, ggml_mul(ctx, all, setting(ctx, inputs, RP_INVERSE_TEMPERATURE)));
    struct ggml_tensor *best = ggml_reshape_2d(ctx, ggml_argmax(ctx, all), 1, rows);
    struct ggml_tensor *best_f = ggml_cast(ctx, best, GGML_TYPE_F32);
    struct ggml_tensor *floor = ggml_add(ctx, logit_at(ctx, logits3, best), setting(ctx, inputs, RP_LOG_MIN_P));
    /* Min-p's kept tokens: logit >= floor (a millionth of slack for the float sum). */
    struct ggml_tensor *min_p_kept = ggml_step(ctx, ggml_scale_bias(ctx, ggml_sub(ctx, all, floor), 1.0f, 1e-6f));
    struct ggml_tensor *weights = ggml_mul(ctx, scaled, min_p_kept);
    struct ggml_tensor *picks[ROW_ROUNDS], *passes[ROW_ROUNDS];
    for (int round = 0; round < ROW_ROUNDS; round++) {
        struct ggml_tensor *cumulative = ggml_cumsum(ctx, weights);
        struct ggml_tensor *total = ggml_cont(
            ctx, ggml_view_2d(ctx, cumulative, 1, rows, cumulative->nb[1],
                              (size_t)(vocabulary - 1) * sizeof(float)));
        struct ggml_tensor *target = ggml_mul(ctx, total, setting(ctx, inputs, RP_UNIFORM + round));
        /* The first token whose running weight passes the target: vocabulary less the
           count of running weights above it. */
        struct ggml_tensor *beyond = ggml_sum_rows(ctx, ggml_step(ctx, ggml_sub(ctx, cumulative, target)));
        struct ggml_tensor *pick = ggml_scale_bias(ctx, ggml_clamp(ctx, beyond, 1.0f, (float)vocabulary),
                                                   -1.0f, (float)vocabulary);
        struct ggml_tensor *logit = logit_at(ctx, logits3, ggml_cast(ctx, pick, GGML_TYPE_I32));
        struct ggml_tensor *above = ggml_step(ctx, ggml_sub(ctx, all, logit));
        struct ggml_tensor *mass_above = ggml_sum_rows(ctx, ggml_mul(ctx, plain, above));
        picks[round] = pick;
        passes[round] = ggml_step(ctx, ggml_sub(ctx, top_p, mass_above)); /* mass_above < top_p */
        if (round + 1 < ROW_ROUNDS) weights = ggml_mul(ctx, weights, above);
    }
    /* The first round that passed, else the best token: pick = pass * pick + (1 - pass) * later. */
    struct ggml_tensor *token = best_f;
    for (int round = ROW_ROUNDS - 1; round >= 0; round--) {
        struct ggml_tensor *difference = ggml_sub(ctx, picks[round], token);
        token = ggml_add(ctx, token, ggml_mul(ctx, passes[round], difference));
    }
    return ggml_cast(ctx, token, GGML_TYPE_I32);
}

/* Columns one sort takes in a single CUDA block (ggml's bitonic argsort, in shared
   memory). Wider rows go to a segmented radix sort, and ggml_top_k may run one
   selection per row: over a 128k vocabulary either costs milliseconds a step. */
enum { SORT_BLOCK = 1024 };
/* Logits per chunk whose maximum the first pass of build_top_candidates takes. */
enum { MAX_CHUNK = 64 };

/* `x` (n x rows) widened to `width` columns of `fill` (width - n < n). */
static struct ggml_tensor *widened(struct ggml_context *ctx, struct ggml_tensor *x, int64_t width,
                                   float fill) {
    const int64_t n = x->ne[0];
    if (width == n) return x;
    struct ggml_tensor *part = ggml_cont(ctx, ggml_view_2d(ctx, x, width - n, x->ne[1], x->nb[1], 0));
    return ggml_concat(ctx, x, ggml_scale_bias(ctx, part, 0.0f, fill), 0);
}

/* The values of `x` (n x rows, contiguous) at `places` (j x rows, I32), as (j x rows). */
static struct ggml_tensor *gathered(struct ggml_context *ctx, struct ggml_tensor *x,
                                    struct ggml_tensor *places) {
    struct ggml_tensor *cells = ggml_reshape_3d(ctx, x, 1, x->ne[0], x->ne[1]);
    return ggml_reshape_2d(ctx, ggml_get_rows(ctx, cells, places), places->ne[0], x->ne[1]);
}

/* The first k columns of `order` (n x rows, I32), contiguous. */
static struct ggml_tensor *leading(struct ggml_context *ctx, struct ggml_tensor *order, int64_t k) {
    return ggml_cont(ctx, ggml_view_2d(ctx, order, k, order->ne[1], order->nb[1], 0));
}

/*
 * The k largest `values` of each row (n x rows, contiguous) and their `ids` (F32, in
 * the same places), largest first, as (k x rows) each, by sorts of at most SORT_BLOCK
 * columns: each round sorts blocks of SORT_BLOCK and keeps each block's k best
 * (the row's k best are among them), until one block is left. k < SORT_BLOCK / 2.
 */
static void best_of(struct ggml_context *ctx, struct ggml_tensor *values, struct ggml_tensor *ids,
                    int64_t k, struct ggml_tensor **best_values, struct ggml_tensor **best_ids) {
    const int64_t rows = values->ne[1];
    while (values->ne[0] > SORT_BLOCK) {
        const int64_t blocks = (values->ne[0] + SORT_BLOCK - 1) / SORT_BLOCK;
        const int64_t width = blocks * SORT_BLOCK;
        values = widened(ctx, values, width, -1e30f);
        ids = widened(ctx, ids, width, 0.0f);
        struct ggml_tensor *order = ggml_argsort(
            ctx, ggml_reshape_2d(ctx, values, SORT_BLOCK, blocks * rows), GGML_SORT_ORDER_DESC);
        /* Each block's best, as places in the row: the place in the block plus its start. */
        struct ggml_tensor *in_block = ggml_cast(ctx, leading(ctx, order, k), GGML_TYPE_F32);
        struct ggml_tensor *starts =
            ggml_reshape_3d(ctx, ggml_arange(ctx, 0.0f, (float)width, (float)SORT_BLOCK), 1, blocks, 1);
        struct ggml_tensor *places =
            ggml_add(ctx, ggml_reshape_3d(ctx, in_block, k, blocks, rows), starts);
        places = ggml_cast(ctx, ggml_reshape_2d(ctx, places, k * blocks, rows), GGML_TYPE_I32);
        values = gathered(ctx, values, places);
        ids = gathered(ctx, ids, places);
    }
    struct ggml_tensor *top = leading(ctx, ggml_argsort(ctx, values, GGML_SORT_ORDER_DESC), k);
    *best_values = gathered(ctx, values, top);
    *best_ids = gathered(ctx, ids, top);
}

/*
 * The `k` largest logits of every row of `all` (vocabulary x rows) and their token
 * ids (I32), largest first, as (k x rows) each, without sorting the vocabulary.
 *
 * One pass takes the maximum of each chunk of MAX_CHUNK logits. The row's k best
 * logits all lie in the k chunks with the largest maxima: a logit in any other chunk
 * is below those k maxima, k logits of the row. So only those chunks' k * MAX_CHUNK
 * logits are sorted for the answer (best_of, as are the chunk maxima to find them).
 * A vocabulary that is not a whole number of chunks is widened by a chunk's filler;
 * one of fewer than k chunks is sorted whole.
 */
static struct ggml_tensor *build_top_candidates(struct ggml_context *ctx, struct ggml_tensor *all,
                                                int64_t k, struct ggml_tensor **values) {
    const int64_t rows = all->ne[1], chunks = (all->ne[0] + MAX_CHUNK - 1) / MAX_CHUNK;
    struct ggml_tensor *ids;
    if (chunks < k) {
        struct ggml_tensor *tokens = ggml_repeat(ctx, ggml_arange(ctx, 0.0f, (float)all->ne[0], 1.0f), all);
        best_of(ctx, all, tokens, k, values, &ids);
        return ggml_cast(ctx, ids, GGML_TYPE_I32);
    }
    all = widened(ctx, all, chunks * MAX_CHUNK, -1e30f);
    struct ggml_tensor *maxima = ggml_pool_1d(ctx, all, GGML_OP_POOL_MAX, MAX_CHUNK, MAX_CHUNK, 0);
    struct ggml_tensor *chunk_ids = ggml_repeat(ctx, ggml_arange(ctx, 0.0f, (float)chunks, 1.0f), maxima);
    struct ggml_tensor *best_maxima, *best_chunks;
    best_of(ctx, maxima, chunk_ids, k, &best_maxima, &best_chunks);
    /* Those chunks' logits (MAX_CHUNK x k x rows) and their token ids. */
    struct ggml_tensor *logits =
        ggml_get_rows(ctx, ggml_reshape_3d(ctx, all, MAX_CHUNK, chunks, rows),
                      ggml_cast(ctx, best_chunks, GGML_TYPE_I32));
    struct ggml_tensor *offsets = ggml_reshape_3d(
        ctx, ggml_arange(ctx, 0.0f, (float)MAX_CHUNK, 1.0f), MAX_CHUNK, 1, 1);
    struct ggml_tensor *firsts =
        ggml_reshape_3d(ctx, ggml_scale(ctx, best_chunks, (float)MAX_CHUNK), 1, k, rows);
    struct ggml_tensor *tokens = ggml_add(ctx, ggml_repeat(ctx, offsets, logits), firsts);
    best_of(ctx, ggml_reshape_2d(ctx, logits, MAX_CHUNK * k, rows),
            ggml_reshape_2d(ctx, tokens, MAX_CHUNK * k, rows), k, values, &ids);
    return ggml_cast(ctx, ids, GGML_TYPE_I32);
}

/* Write the settings input from the callers' per-sequence settings, once a step for
   each graph. */
static void gs_backend_set_input(struct llama_sampler *smpl) {
    Plan *plan = ((Seat *)smpl->ctx)->plan;
    if (plan->row_inputs == NULL) return;
    if (plan->written_step == plan->step && plan->written_generation == plan->generation) return;
    const int64_t rows = plan->row_inputs->ne[1];
    for (int64_t row = 0; row < rows; row++) {
        float *own = plan->staging + row * ROW_PARAMS;
        const int32_t seq_id = row <= plan->sequences ? plan->row_seq[row] : -1;
        if (seq_id >= 0) {
            memcpy(own, plan->row_params + (size_t)seq_id * ROW_PARAMS, ROW_PARAMS * sizeof(float));
            continue;
        }
        own[RP_INVERSE_TEMPERATURE] = 1.0f;
        own[RP_TOP_P] = 2.0f;
        own[RP_LOG_MIN_P] = -1e30f;
        for (int round = 0; round < ROW_ROUNDS; round++) own[RP_UNIFORM + round] = 0.5f;
    }
    ggml_backend_tensor_set(plan->row_inputs, plan->staging, 0, (size_t)rows * ROW_PARAMS * sizeof(float));
    plan->written_step = plan->step;
    plan->written_generation = plan->generation;
}

static void gs_backend_apply(struct llama_sampler *smpl, struct ggml_context *ctx,
                             struct ggml_cgraph *gf, struct llama_sampler_data *data) {
    (void)gf;
    Seat *seat = (Seat *)smpl->ctx;
    Plan *plan = seat->plan;
    struct ggml_tensor *row = data->logits;
    /* A step's row is a view of the tensor holding every row. llama.cpp's probe, made
       once when the sampler is set up to size its graphs, hands a lone row instead:
       it is shown the most this sampler ever adds (a TOP row's), whatever the mode. */
    struct ggml_tensor *all = row->view_src;
    const int probe = all == NULL || all->ne[0] != row->ne[0];
    int mode = seat->seq_id < plan->sequences ? plan->modes[seat->seq_id] : GS_HOST;
    if (probe) mode = GS_TOP;
    if (mode == GS_HOST) return;
    int64_t index = 0;
    if (probe) {
        all = ggml_reshape_2d(ctx, row, row->ne[0], 1);
    } else {
        index = (int64_t)(row->view_offs / all->nb[1]);
    }
    if (plan->source != all) {
        plan->source = all;
        plan->argmax = NULL;
        plan->top_ids = NULL;
        plan->top_values = NULL;
        plan->row_inputs = NULL;
        plan->row_tokens = NULL;
    }
    if (mode == GS_ROW || probe) {
        if (plan->row_tokens == NULL) {
            plan->row_inputs = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, ROW_PARAMS, all->ne[1]);
            ggml_set_input(plan->row_inputs);
            plan->row_tokens = build_row_draws(ctx, all, plan->row_inputs);
        }
        struct ggml_tensor *token =
            ggml_view_1d(ctx, plan->row_tokens, 1, index * plan->row_tokens->nb[1]);
        if (!probe) {
            if (index <= plan->sequences) plan->row_seq[index] = seat->seq_id;
            data->sampled = token;
            data->logits = NULL;
            return;
        }
        data->sampled = token; /* the probe sees every operation of both paths */
    }
    if (mode == GS_GREEDY) {
        if (plan->argmax == NULL) plan->argmax = ggml_argmax(ctx, all);
        data->sampled = ggml_view_1d(ctx, plan->argmax, 1, index * plan->argmax->nb[0]);
        data->logits = NULL; /* the token alone comes back */
        return;
    }
    const int64_t top = plan->top < row->ne[0] ? plan->top : row->ne[0];
    if (plan->top_ids == NULL) plan->top_ids = build_top_candidates(ctx, all, top, &plan->top_values);
    data->candidates = ggml_view_1d(ctx, plan->top_ids, top, index * plan->top_ids->nb[1]);
    data->logits = ggml_view_1d(ctx, plan->top_values, top, index * plan->top_values->nb[1]);
}

static struct llama_sampler_i gs_interface = {
    /* .name              = */ gs_name,
    /* .accept            = */ NULL,
    /* .apply             = */ gs_apply,
    /* .reset             = */ NULL,
    /* .clone             = */ NULL,
    /* .free              = */ gs_free,
    /* .backend_init      = */ gs_backend_init,
    /* .backend_accept    = */ NULL,
    /* .backend_apply     = */ gs_backend_apply,
    /* .backend_set_input = */ gs_backend_set_input,
    /* .backend_reset     = */ gs_backend_reset,
    /* .copy_state        = */ NULL,
};

void gs_plan_free(Plan *plan);

/* A plan for `sequences` sequence ids, every mode GS_HOST. */
Plan *gs_plan_new(int32_t sequences) {
    Plan *plan = calloc(1, sizeof(Plan));
    if (plan == NULL) return NULL;
    plan->modes = calloc((size_t)sequences, 1);
    plan->row_seq = malloc(((size_t)sequences + 1) * sizeof(int32_t));
    plan->row_params = calloc((size_t)sequences * ROW_PARAMS, sizeof(float));
    plan->staging = calloc(((size_t)sequences + 1) * ROW_PARAMS, sizeof(float));
    if (plan->modes == NULL || plan->row_seq == NULL || plan->row_params == NULL ||
        plan->staging == NULL) {
        gs_plan_free(plan);
        return NULL;
    }
    for (int32_t i = 0; i <= sequences; i++) plan->row_seq[i] = -1;
    plan->sequences = sequences;
    plan->top = 1;
    return plan;
}

/* Free a plan once the context its samplers were given to is freed. */
void gs_plan_free(Plan *plan) {
    if (plan == NULL) return;
    free(plan->modes);
    free(plan->row_seq);
    free(plan->row_params);
    free(plan->staging);
    free(plan);
}

uint8_t *gs_plan_modes(Plan *plan) { return plan->modes; }

/* The GS_ROW settings, ROW_PARAMS floats a sequence id (see RP_*). */
float *gs_plan_row_params(Plan *plan) { return plan->row_params; }

int32_t gs_row_params(void) { return ROW_PARAMS; }

/* Before each decode: the GS_ROW settings written since are this step's. */
void gs_plan_next_step(Plan *plan) { plan->step++; }

/* Candidates a GS_TOP row gets: 1 to SORT_BLOCK / 2 - 1 (best_of's bound). */
void gs_plan_set_top(Plan *plan, int32_t top) {
    plan->top = top < 1 ? 1 : top < SORT_BLOCK / 2 ? top : SORT_BLOCK / 2 - 1;
}

/* The sampler chain for one sequence id, for llama_context_params.samplers; the
   context frees it. NULL when out of memory. */
struct llama_sampler *gs_sampler_new(Plan *plan, int32_t seq_id) {
    Seat *seat = malloc(sizeof(Seat));
    if (seat == NULL) return NULL;
    seat->plan = plan;
    seat->seq_id = seq_id;
    struct llama_sampler *own = llama_sampler_init(&gs_interface, seat);
    struct llama_sampler *chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
    llama_sampler_chain_add(chain, own);
    return chain;
}

typedef enum ggml_status (*Compute)(struct ggml_context *, struct ggml_cgraph *, int);

/* A context for a test's graph on the CPU, holding `bytes` of tensors; NULL when out
   of memory. */
static struct ggml_context *cpu_context(size_t bytes) {
    struct ggml_init_params init = {
        /* .mem_size   = */ bytes + 1024 * ggml_tensor_overhead() + ggml_graph_overhead(),
        /* .mem_buffer = */ NULL,
        /* .no_alloc   = */ false,
    };
    return ggml_init(init);
}

/* Compute `result` and `also` (or NULL) with ggml's CPU backend (looked up at run
   time: this library links only llama.cpp's interface): 0, -1 when it fails. */
static int computed_on_cpu(struct ggml_context *ctx, struct ggml_tensor *result,
                           struct ggml_tensor *also, int threads) {
    Compute compute = (Compute)dlsym(RTLD_DEFAULT, "ggml_graph_compute_with_ctx");
    if (compute == NULL) return -1;
    struct ggml_cgraph *graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, result);
    if (also != NULL) ggml_build_forward_expand(graph, also);
    return compute(ctx, graph, threads) == GGML_STATUS_SUCCESS ? 0 : -1;
}

/*
 * The GS_ROW draw of `rows` rows of `vocabulary` logits by `settings` (ROW_PARAMS a
 * row) into tokens[], computed by ggml on the CPU without a model: the same
 * operations a step's graph runs, for tests that set the logits themselves. Returns
 * 0; -1 when out of memory or where ggml's CPU backend is not loaded.
 */
int gs_draw_rows_on_cpu(const float *logits, int64_t vocabulary, int64_t rows,
                        const float *settings, int32_t *tokens, int threads) {
    /* Every operation keeps its own result here: about 40 of the rows' size. */
    const size_t table = (size_t)vocabulary * (size_t)rows * sizeof(float);
    struct ggml_context *ctx = cpu_context(48 * table);
    if (ctx == NULL) return -1;
    struct ggml_tensor *all = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, vocabulary, rows);
    struct ggml_tensor *inputs = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, ROW_PARAMS, rows);
    memcpy(all->data, logits, table);
    memcpy(inputs->data, settings, (size_t)rows * ROW_PARAMS * sizeof(float));
    struct ggml_tensor *drawn = build_row_draws(ctx, all, inputs);
    const int status = computed_on_cpu(ctx, drawn, NULL, threads);
    if (status == 0) memcpy(tokens, drawn->data, (size_t)rows * sizeof(int32_t));
    ggml_free(ctx);
    return status;
}

/* The GS_TOP candidates of `rows` rows of `vocabulary` logits: each row's `k` largest
   logits, largest first, into values[] and their token ids into ids[] (k a row),
   computed as gs_draw_rows_on_cpu computes its draws. Returns 0, or -1. */
int gs_top_on_cpu(const float *logits, int64_t vocabulary, int64_t rows, int64_t k, int32_t *ids,
                  float *values, int threads) {
    const size_t table = (size_t)vocabulary * (size_t)rows * sizeof(float);
    struct ggml_context *ctx = cpu_context(4 * table + 64 * (size_t)k * MAX_CHUNK * (size_t)rows * sizeof(float));
    if (ctx == NULL) return -1;
    struct ggml_tensor *all = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, vocabulary, rows);
    memcpy(all->data, logits, table);
    struct ggml_tensor *best;
    struct ggml_tensor *found = build_top_candidates(ctx, all, k, &best);
    const int status = computed_on_cpu(ctx, found, best, threads);
    if (status == 0) {
        memcpy(ids, found->data, (size_t)(k * rows) * sizeof(int32_t));
        memcpy(values, best->data, (size_t)(k * rows) * sizeof(float));
    }
    ggml_free(ctx);
    return status;
}
