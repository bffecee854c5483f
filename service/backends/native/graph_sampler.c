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
 *   GS_TOP     the row's `top` largest logits and their token ids, from one top-k
 *              over every row, for the host to finish the draw on (penalties,
 *              top-k, top-p, min-p, temperature and the seeded draw: sampler.c's
 *              sample_candidates, the same numbers as from the whole row).
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
#include <stdint.h>
#include <stdlib.h>

#include "ggml.h"
#include "llama.h"

enum { GS_HOST = 0, GS_GREEDY = 1, GS_TOP = 2 };

typedef struct {
    int32_t sequences;
    uint8_t *modes; /* by sequence id, written by the caller before a step */
    int32_t top;    /* candidates per GS_TOP row */
    /* This graph's shared operations, made by the first sequence needing each. */
    struct ggml_tensor *source;
    struct ggml_tensor *argmax;
    struct ggml_tensor *top_ids;
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
    }
    if (mode == GS_GREEDY) {
        if (plan->argmax == NULL) plan->argmax = ggml_argmax(ctx, all);
        data->sampled = ggml_view_1d(ctx, plan->argmax, 1, index * plan->argmax->nb[0]);
        data->logits = NULL; /* the token alone comes back */
        return;
    }
    const int64_t top = plan->top < row->ne[0] ? plan->top : row->ne[0];
    if (plan->top_ids == NULL) plan->top_ids = ggml_top_k(ctx, all, (int)top);
    struct ggml_tensor *ids =
        ggml_view_1d(ctx, plan->top_ids, top, index * plan->top_ids->nb[1]);
    /* The row, as that many rows of one value each, to gather the candidates' values. */
    struct ggml_tensor *values = ggml_get_rows(ctx, ggml_reshape_2d(ctx, row, 1, row->ne[0]), ids);
    data->candidates = ids;
    data->logits = ggml_reshape_1d(ctx, values, top);
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
    /* .backend_set_input = */ NULL,
    /* .backend_reset     = */ gs_backend_reset,
    /* .copy_state        = */ NULL,
};

/* A plan for `sequences` sequence ids, every mode GS_HOST. */
Plan *gs_plan_new(int32_t sequences) {
    Plan *plan = calloc(1, sizeof(Plan));
    if (plan == NULL) return NULL;
    plan->modes = calloc((size_t)sequences, 1);
    if (plan->modes == NULL) {
        free(plan);
        return NULL;
    }
    plan->sequences = sequences;
    plan->top = 1;
    return plan;
}

/* Free a plan once the context its samplers were given to is freed. */
void gs_plan_free(Plan *plan) {
    if (plan == NULL) return;
    free(plan->modes);
    free(plan);
}

uint8_t *gs_plan_modes(Plan *plan) { return plan->modes; }

void gs_plan_set_top(Plan *plan, int32_t top) { plan->top = top < 1 ? 1 : top; }

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
