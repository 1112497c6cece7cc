// The GLM-5.3-Flash (`glm5_next`) text model: loads a checkpoint directory and runs the forward pass on a backend.
// forward() appends tokens to a sequence: a multi-token call is a prefill (KDA in chunked form), a one-token call a
// decode step (KDA recurrent form); both read and extend the sequence's caches, so any split of a sequence into calls
// yields the same logits as one call over the whole sequence. forward_batch() runs calls of several sequences as one
// pass: the per-token work (projections, experts, mHC, norms, the head) on all their tokens together, so each weight
// is read once per pass, and only the state-bound steps (convolution, KDA recurrence, cache appends, the indexer,
// attention) per sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "backend/workspace.h"
#include "formats/checkpoint.h"
#include "formats/glm5_next_config.h"
#include "model/forward_profile.h"
#include "model/glm5_next_weights.h"
#include "model/sequence_state.h"

namespace kestrel {

// Sees the float32 input rows of linear layers during forward(), by checkpoint module name (the weight's name without
// its last component, e.g. "model.language_model.layers.3.mlp.experts.17.gate_proj"): the quantizer's Hessian
// capture. Reported today: each routed expert's gate_proj and up_proj (the same rows, reported under both names) and
// down_proj (the clamped SwiGLU activations), for the tokens routed to it. Called from the forward's thread.
class LinearInputObserver {
public:
  virtual ~LinearInputObserver() = default;
  // rows: [count, width] row-major.
  virtual void observe(std::string_view module, const float* rows, int64_t count, int64_t width) = 0;
};

struct ForwardOptions {
  bool all_logits = true;  // logits for every new token, else only for the last one
  ForwardProfile* profile = nullptr;  // where the pass's time goes is added here (slows the pass; see the type)
};

// A token drawn on the backend from a call's last logits.
struct BackendDraw {
  TokenDraw draw;
  int32_t token = -1;  // set by the forward
};

// One sequence's part of a batched forward: tokens appended after its current contents.
struct SequenceCall {
  SequenceState* sequence;
  std::span<const int32_t> tokens;
  bool logits = true;  // false: nothing goes through the head for this call (a prompt block before the last)
  // With logits: the backend draws the token after the call's last one (Backend::draw_tokens) into draw->token, and
  // the call's logits stay on the backend (forward_batch returns none for it).
  BackendDraw* draw = nullptr;
};

class Glm5NextModel {
public:
  // Reads config.json and the weights of `dir`; throws Error naming the file and tensor on any problem. The
  // sequences of new_sequence keep their latents in `latent_dtype` (the engine's cache has its own pools).
  static std::unique_ptr<Glm5NextModel> load(const std::string& dir, Backend& backend,
                                             CacheDtype latent_dtype = CacheDtype::float32);

  const Glm5NextConfig& config() const { return config_; }
  const Glm5NextWeights& weights() const { return weights_; }
  Backend& backend() { return backend_; }

  std::unique_ptr<SequenceState> new_sequence();

  // Runs `tokens` through the model after the sequence's current contents and returns their logits,
  // [T, vocab] (or [1, vocab] with all_logits = false). Token ids outside [0, vocab) are an Error.
  std::vector<float> forward(SequenceState& sequence, std::span<const int32_t> tokens,
                             const ForwardOptions& options = {});
  // The same for several distinct sequences in one pass: entry i holds call i's logits as forward() returns them.
  // Calls with no tokens, without `logits` or with a draw get none; a sequence named twice is an Error.
  std::vector<std::vector<float>> forward_batch(std::span<const SequenceCall> calls, const ForwardOptions& options = {});

  // Installs (or, with nullptr, removes) the input observer; the forward pays nothing extra without one.
  void set_input_observer(LinearInputObserver* observer) { observer_ = observer; }

private:
  Glm5NextModel(Glm5NextConfig config, Checkpoint checkpoint, Backend& backend, CacheDtype latent_dtype);

  // Where a call's tokens sit among the pass's rows.
  struct CallRows {
    SequenceState* sequence;
    int64_t start;   // tokens the sequence held before the pass
    int64_t offset;  // first row of the pass
    int64_t count;
    bool logits;
    BackendDraw* draw;
  };
  // Every call a single token (row i is call i's), as in a decode step.
  static bool one_token_each(std::span<const CallRows> calls);
  // A decode step of several sequences, which the batched attention op takes.
  static bool is_decode_step(std::span<const CallRows> calls);
  // Each block reads the normalised sub-block input x [T, hidden] of all the pass's rows and writes its output
  // [T, hidden]; its temporaries come from the forward's workspace and go back to it when the block returns.
  void kda_block(Workspace& ws, const KdaWeights& w, int64_t layer, std::span<const CallRows> calls, const float* x,
                 int64_t T, float* out);
  // The DSA positions each new token attends to: made by a full indexer layer, reused by the shared ones after it.
  struct Selection {
    int32_t* positions;  // [T, stride]
    int32_t* counts;     // [T]
    int64_t stride;
    bool made;
  };
  void mla_block(Workspace& ws, const MlaWeights& w, int64_t layer, std::span<const CallRows> calls, const float* x,
                 int64_t T, Selection& selection, float* out);
  void mlp_block(Workspace& ws, const MlpWeights& w, const float* x, int64_t T, float* out);
  void moe_block(Workspace& ws, const MoeWeights& w, const float* x, int64_t T, float* out);
  // Recomputes each routed expert's inputs for the observer (outside the backend's fused expert op).
  void observe_experts(Workspace& ws, const MoeWeights& w, const float* x, int64_t T, const int32_t* expert_ids);

  Glm5NextConfig config_;
  Checkpoint checkpoint_;  // owns the mappings the weights point into
  Backend& backend_;
  Glm5NextWeights weights_;
  CachePools pools_;
  LinearInputObserver* observer_ = nullptr;
  ForwardProfile* profile_ = nullptr;  // the running pass's ForwardOptions::profile
};

}  // namespace kestrel
