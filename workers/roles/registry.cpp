// registry.cpp: register_worker_types (see registry.hpp).
#include "workers/roles/registry.hpp"

#include <memory>

#include "dispatch/worker_group.hpp"
#include "workers/roles/actor_rollout_ref_worker.hpp"
#include "workers/roles/critic_worker.hpp"
#include "workers/roles/reward_model_worker.hpp"

namespace tessera::workers {

namespace {

// Adapts a worker class's create() to the WorkerBase factory signature.
template <class W>
dispatch::WorkerBaseFactory factory_of() {
  return [](const runtime::WorkerContext& context,
            const nlohmann::json& init_config) -> Result<std::unique_ptr<dispatch::WorkerBase>> {
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<W> w, W::create(context, init_config));
    return std::unique_ptr<dispatch::WorkerBase>(std::move(w));
  };
}

}  // namespace

Status register_worker_types(runtime::WorkerTypeRegistry& registry) {
  TESSERA_RETURN_IF_ERROR(
      dispatch::register_worker_type(registry, kActorRolloutRefWorkerType, factory_of<ActorRolloutRefWorker>()));
  TESSERA_RETURN_IF_ERROR(dispatch::register_worker_type(registry, kCriticWorkerType, factory_of<CriticWorker>()));
  TESSERA_RETURN_IF_ERROR(
      dispatch::register_worker_type(registry, kRewardModelWorkerType, factory_of<RewardModelWorker>()));
  return Status();
}

}  // namespace tessera::workers
