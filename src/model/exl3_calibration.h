// Hessian capture for `kestrel quantize`: runs calibration token rows through our own forward (any backend) with a
// LinearInputObserver that accumulates xᵀx per routed expert (shared/docs/exl3-format.md §4.2). An expert's gate_proj
// and up_proj read the same rows and share one Hessian (and, when quantized, the same input sign flips, as exllamav3's
// shared `H_data` does); down_proj has its own, over the SwiGLU activations.
//
// Memory: one in x in double matrix per expert that received tokens, all layers at once (the forward runs whole).
// Fine for test-sized models; the full GLM-5.3-Flash (288 experts x 3 x 42 layers, 4096² + 2048² per expert) would
// need ~2 TB, so calibrating it needs a layer-at-a-time capture, which this does not do.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/exl3_hessian.h"
#include "model/glm5_next.h"

namespace kestrel {

class ExpertHessians : public LinearInputObserver {
public:
  void observe(std::string_view module, const float* rows, int64_t count, int64_t width) override;

  // The accumulator whose rows reach `module` ("...experts.E.gate_proj" and "...up_proj" give the same one), or
  // nullptr if no calibration row was routed there.
  const exl3::HessianAccumulator* find(std::string_view module) const;

  // The key of the Hessian `module` uses: gate_proj and up_proj of one expert map to ".../gate_up".
  static std::string group_of(std::string_view module);

private:
  std::map<std::string, std::unique_ptr<exl3::HessianAccumulator>, std::less<>> accumulators_;
};

// Runs each row (a token sequence) through a fresh sequence of `model` with `hessians` observing. Returns the number of
// tokens run.
int64_t run_calibration(Glm5NextModel& model, const std::vector<std::vector<int32_t>>& rows, ExpertHessians& hessians);

// Cuts a token stream into rows of at most `cols` tokens, at most `max_rows` of them (exllamav3's rows x cols).
std::vector<std::vector<int32_t>> calibration_rows(std::span<const int32_t> tokens, int64_t cols, int64_t max_rows);

}  // namespace kestrel
