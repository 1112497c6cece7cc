#include "model/exl3_calibration.h"

#include <algorithm>

#include "base/error.h"

namespace kestrel {

namespace {

constexpr std::string_view kUp = ".up_proj", kGate = ".gate_proj";

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

}  // namespace

std::string ExpertHessians::group_of(std::string_view module) {
  if (ends_with(module, kGate)) return std::string(module.substr(0, module.size() - kGate.size())) + ".gate_up";
  if (ends_with(module, kUp)) return std::string(module.substr(0, module.size() - kUp.size())) + ".gate_up";
  return std::string(module);
}

void ExpertHessians::observe(std::string_view module, const float* rows, int64_t count, int64_t width) {
  // up_proj is reported with gate_proj's rows: count them once.
  if (ends_with(module, kUp)) return;
  const std::string group = group_of(module);
  auto at = accumulators_.find(group);
  if (at == accumulators_.end()) {
    at = accumulators_.emplace(group, std::make_unique<exl3::HessianAccumulator>(width)).first;
  }
  require(at->second->in_features() == width, "calibration: {} saw rows of width {} after {}", module, width,
          at->second->in_features());
  at->second->add(rows, count);
}

const exl3::HessianAccumulator* ExpertHessians::find(std::string_view module) const {
  const auto at = accumulators_.find(group_of(module));
  return at == accumulators_.end() ? nullptr : at->second.get();
}

int64_t run_calibration(Glm5NextModel& model, const std::vector<std::vector<int32_t>>& rows, ExpertHessians& hessians) {
  model.set_input_observer(&hessians);
  int64_t tokens = 0;
  try {
    for (const auto& row : rows) {
      const auto sequence = model.new_sequence();
      model.forward(*sequence, row, {.all_logits = false});
      tokens += static_cast<int64_t>(row.size());
    }
  } catch (...) {
    model.set_input_observer(nullptr);
    throw;
  }
  model.set_input_observer(nullptr);
  return tokens;
}

std::vector<std::vector<int32_t>> calibration_rows(std::span<const int32_t> tokens, int64_t cols, int64_t max_rows) {
  require(cols > 0 && max_rows > 0, "calibration: rows ({}) and columns ({}) must be positive", max_rows, cols);
  std::vector<std::vector<int32_t>> rows;
  for (size_t begin = 0; begin < tokens.size() && static_cast<int64_t>(rows.size()) < max_rows;
       begin += static_cast<size_t>(cols)) {
    const size_t end = std::min(tokens.size(), begin + static_cast<size_t>(cols));
    rows.emplace_back(tokens.begin() + static_cast<std::ptrdiff_t>(begin),
                      tokens.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return rows;
}

}  // namespace kestrel
