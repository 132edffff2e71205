// fsdp_trainable.cpp: FsdpTrainableModule (see fsdp_trainable.hpp).
#include "workers/ppo/fsdp_trainable.hpp"

#include <cmath>
#include <utility>

#include <torch/torch.h>

#include "workers/ppo/ppo_inputs.hpp"

namespace tessera::ppo {

FsdpTrainableModule::FsdpTrainableModule(std::shared_ptr<models::PretrainedModel> model,
                                         std::unique_ptr<fsdp::FsdpModule> engine, bool trainable)
    : model_(std::move(model)), engine_(std::move(engine)), trainable_(trainable) {}

FsdpTrainableModule::~FsdpTrainableModule() = default;

Result<std::shared_ptr<FsdpTrainableModule>> FsdpTrainableModule::create(std::shared_ptr<models::PretrainedModel> model,
                                                                         std::unique_ptr<fsdp::FsdpModule> engine,
                                                                         bool trainable) {
  if (!model) return make_error(ErrorCode::invalid_argument, "FsdpTrainableModule: null model");
  if (!engine) return make_error(ErrorCode::invalid_argument, "FsdpTrainableModule: null FSDP engine");
  return std::shared_ptr<FsdpTrainableModule>(
      new FsdpTrainableModule(std::move(model), std::move(engine), trainable));
}

// begin_forward, the model's head, and (eval) end_forward; the pass is abandoned on an exception.
template <class F>
Result<at::Tensor> FsdpTrainableModule::run_forward(ForwardMode mode, F&& head) {
  const bool train = mode == ForwardMode::train;
  if (train && !trainable_) {
    return make_error(ErrorCode::invalid_argument, "FsdpTrainableModule: train-mode forward on a frozen module");
  }
  TESSERA_RETURN_IF_ERROR(engine_->begin_forward(train ? fsdp::ForwardMode::train : fsdp::ForwardMode::eval));
  in_train_forward_ = train;
  try {
    model_->train(train);
    at::Tensor out = head();
    if (!train) {
      in_train_forward_ = false;
      TESSERA_RETURN_IF_ERROR(engine_->end_forward());
    }
    return out;
  } catch (...) {
    Status st = status_from_current_exception("FSDP forward");
    in_train_forward_ = false;
    (void)engine_->end_forward();
    return st;
  }
}

Result<at::Tensor> FsdpTrainableModule::forward(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                                const at::Tensor& position_ids, ForwardMode mode, models::HeadRows rows) {
  return run_forward(mode, [&] { return model_->forward_head(input_ids, attention_mask, position_ids, rows); });
}

Result<at::Tensor> FsdpTrainableModule::forward_packed(const PackedBatch& b, ForwardMode mode) {
  return run_forward(mode, [&] {
    return model_->forward_packed_head(b.input_ids, b.position_ids, b.segments, b.head_index);
  });
}

Status FsdpTrainableModule::backward(const at::Tensor& loss) {
  if (!in_train_forward_) {
    return make_error(ErrorCode::invalid_argument, "FsdpTrainableModule: backward() without a train-mode forward");
  }
  in_train_forward_ = false;
  try {
    return engine_->backward(loss);
  } catch (...) {
    Status st = status_from_current_exception("FSDP backward");
    (void)engine_->end_forward();
    return st;
  }
}

Status FsdpTrainableModule::end_forward() {
  in_train_forward_ = false;
  return engine_->end_forward();
}

Result<StepOutcome> FsdpTrainableModule::clip_and_step(double max_norm) {
  if (!trainable_) {
    return make_error(ErrorCode::invalid_argument, "FsdpTrainableModule: clip_and_step on a module without optimizer");
  }
  const double configured = engine_->optimizer_options().clip_grad;
  if (std::abs(configured - max_norm) > 1e-12 * std::max(1.0, std::abs(max_norm))) {
    return make_error(ErrorCode::invalid_argument,
                      "FsdpTrainableModule: grad_clip {} differs from the engine's clip_grad {} set at wrap", max_norm,
                      configured);
  }
  try {
    TESSERA_ASSIGN_OR_RETURN(fsdp::StepResult r, engine_->step());
    return StepOutcome{r.grad_norm, r.skipped};
  } catch (...) {
    return status_from_current_exception("FSDP step");
  }
}

void FsdpTrainableModule::zero_grad() { engine_->zero_grad(); }

double FsdpTrainableModule::lr() const { return engine_->current_lr(); }

MicroBatchCountSync make_dp_count_sync(std::shared_ptr<collective::Communicator> dp_group) {
  if (!dp_group || dp_group->size() <= 1) return {};
  return [group = std::move(dp_group)](int64_t local) -> Result<int64_t> {
    at::Tensor t = at::full({1}, local, at::TensorOptions(at::kLong));
    Status st = group->all_reduce(t, collective::ReduceOp::max);
    if (!st.ok()) return st.with_context("dp micro-batch count sync");
    return t.item<int64_t>();
  };
}

}  // namespace tessera::ppo
