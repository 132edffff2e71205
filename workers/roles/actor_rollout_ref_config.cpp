// actor_rollout_ref_config.cpp: parsing and batch-size normalisation of ActorRolloutRefWorker's
// init config, and the generation eos/pad ids of a model directory (actor_rollout_ref_worker.hpp).
#include <algorithm>
#include <filesystem>
#include <fstream>

#include "workers/roles/actor_rollout_ref_worker.hpp"
#include "workers/ppo/ppo_batching.hpp"
#include "workers/ppo/ppo_inputs.hpp"

namespace tessera::workers {

using json = nlohmann::json;

const std::vector<std::string>& actor_rollout_ref_roles() {
  static const std::vector<std::string> roles = {"actor", "rollout", "ref", "actor_rollout", "actor_rollout_ref"};
  return roles;
}

namespace {

constexpr const char* kPath = "actor_rollout_ref";

Result<RefConfig> parse_ref(const json& j) {
  RefConfig c;
  ppo::ConfigReader r(j, std::string(kPath) + ".ref");
  for (const char* k : {"_target_", "strategy", "use_torch_compile", "entropy_from_logits_with_chunking",
                        "entropy_checkpointing", "profiler"}) {
    r.skip(k);
  }
  r.field("log_prob_micro_batch_size", c.log_prob_micro_batch_size);
  r.field("log_prob_micro_batch_size_per_gpu", c.log_prob_micro_batch_size_per_gpu);
  r.field("log_prob_use_dynamic_bsz", c.log_prob_use_dynamic_bsz);
  r.field("log_prob_max_token_len_per_gpu", c.log_prob_max_token_len_per_gpu);
  r.field("ulysses_sequence_parallel_size", c.ulysses_sequence_parallel_size);
  c.fsdp_config = r.nested("fsdp_config");
  TESSERA_RETURN_IF_ERROR(r.finish());
  return c;
}

// A deprecated global log-prob micro-batch size becomes its per-GPU form (verl §3.4); a pass
// that needs a micro-batch size and has none is refused, naming both keys.
Status normalize_log_prob_micro(std::optional<int64_t>& global, std::optional<int64_t>& per_gpu, bool dynamic,
                                int64_t dp, const std::string& prefix) {
  if (global) {
    TESSERA_ASSIGN_OR_RETURN(int64_t v, ppo::normalize_global_micro_batch_size(*global, dp, prefix + "log_prob_micro_batch_size"));
    per_gpu = v;
    global.reset();
  }
  if (!per_gpu && !dynamic) {
    return make_error(ErrorCode::invalid_argument,
                      "{0}log_prob_micro_batch_size_per_gpu (or {0}log_prob_micro_batch_size) must be set when "
                      "{0}log_prob_use_dynamic_bsz is false",
                      prefix);
  }
  if (per_gpu && *per_gpu < 1) {
    return make_error(ErrorCode::invalid_argument, "{}log_prob_micro_batch_size_per_gpu = {} must be >= 1", prefix,
                      *per_gpu);
  }
  return Status();
}

Status parse_role(const json& init, ActorRolloutRefConfig& c) {
  if (!init.is_object() || !init.contains("role") || !init["role"].is_string()) {
    return make_error(ErrorCode::invalid_argument, "actor_rollout_ref init config: 'role' (a string) is required");
  }
  c.role = init["role"].get<std::string>();
  const auto& roles = actor_rollout_ref_roles();
  if (std::find(roles.begin(), roles.end(), c.role) == roles.end()) {
    return make_error(ErrorCode::invalid_argument,
                      "actor_rollout_ref init config: role '{}' is not one of actor, rollout, ref, actor_rollout, "
                      "actor_rollout_ref",
                      c.role);
  }
  c.is_actor = c.role == "actor" || c.role == "actor_rollout" || c.role == "actor_rollout_ref";
  c.is_rollout = c.role == "rollout" || c.role == "actor_rollout" || c.role == "actor_rollout_ref";
  c.is_ref = c.role == "ref" || c.role == "actor_rollout_ref";
  if (init.contains("seed") && !init["seed"].is_null()) {
    if (!init["seed"].is_number_integer()) {
      return make_error(ErrorCode::invalid_argument, "actor_rollout_ref init config: seed = {} is not an integer",
                        init["seed"].dump());
    }
    c.seed = init["seed"].get<uint64_t>();
  }
  return Status();
}

// The actor block: parsed for actor and rollout roles (the rollout shares the actor's FSDP model);
// batch sizes are normalised only when the role trains (verl normalises under _is_actor).
Status parse_actor(const json& actor_json, int64_t dp, ActorRolloutRefConfig& c) {
  TESSERA_ASSIGN_OR_RETURN(ppo::ActorConfig actor, ppo::parse_actor_config(actor_json, std::string(kPath) + ".actor"));
  c.actor = actor;
  if (c.is_actor) {
    ppo::DataParallelShape shape{dp, actor.ulysses_sequence_parallel_size};
    TESSERA_ASSIGN_OR_RETURN(c.actor, ppo::normalize_actor_config(actor, c.rollout.n, shape));
  }
  if (actor_json.is_object()) {
    c.actor_fsdp_config = actor_json.value("fsdp_config", json());
    c.actor_optim = actor_json.value("optim", json());
  }
  if (c.actor_optim.is_null()) c.actor_optim = json::object();  // verl's defaults
  return Status();
}

}  // namespace

Result<ActorRolloutRefConfig> parse_actor_rollout_ref_config(const json& init, int64_t dp) {
  ActorRolloutRefConfig c;
  TESSERA_RETURN_IF_ERROR(parse_role(init, c));
  const json config = init.value("config", json());
  ppo::ConfigReader r(config, kPath);
  for (const char* k : {"_target_", "hybrid_engine", "profiler"}) r.skip(k);
  int64_t nccl_timeout = 600;
  r.field("nccl_timeout", nccl_timeout);
  const json& model = r.nested("model");
  const json& actor = r.nested("actor");
  const json& rollout = r.nested("rollout");
  const json& ref = r.nested("ref");
  TESSERA_RETURN_IF_ERROR(r.finish());
  if (nccl_timeout < 1) {
    return make_error(ErrorCode::invalid_argument, "{}.nccl_timeout = {} must be >= 1 (seconds)", kPath, nccl_timeout);
  }
  c.nccl_timeout = std::chrono::seconds(nccl_timeout);

  TESSERA_ASSIGN_OR_RETURN(c.model, parse_model_section(model, std::string(kPath) + ".model"));
  TESSERA_ASSIGN_OR_RETURN(auto parsed_rollout, rollout::parse_rollout_config(rollout.is_null() ? json::object() : rollout));
  c.rollout = parsed_rollout.config;
  if (c.is_rollout && dp % c.rollout.tensor_model_parallel_size != 0) {
    return make_error(ErrorCode::invalid_argument,
                      "{}.rollout.tensor_model_parallel_size={} does not divide the rollout world size {}", kPath,
                      c.rollout.tensor_model_parallel_size, dp);
  }
  // verl's worker takes its sequence-parallel size from the actor block, whatever its role; a
  // split-placement rollout (neither actor nor reference) runs no sequence-parallel pass.
  c.ulysses_sequence_parallel_size = 1;
  if ((c.is_actor || c.is_ref) && actor.is_object() && actor.contains("ulysses_sequence_parallel_size")) {
    const json& sp = actor["ulysses_sequence_parallel_size"];
    if (!sp.is_number_integer() || sp.get<int64_t>() < 1) {
      return make_error(ErrorCode::invalid_argument, "{}.actor.ulysses_sequence_parallel_size = {} must be an integer "
                        ">= 1", kPath, sp.dump());
    }
    c.ulysses_sequence_parallel_size = sp.get<int64_t>();
  }
  if (dp % c.ulysses_sequence_parallel_size != 0) {
    return make_error(ErrorCode::invalid_argument,
                      "{}.actor.ulysses_sequence_parallel_size = {} does not divide the worker group's {} ranks", kPath,
                      c.ulysses_sequence_parallel_size, dp);
  }
  // Per-rank batch sizes divide by the data-parallel groups (verl: world / sequence-parallel size).
  const int64_t dp_groups = dp / c.ulysses_sequence_parallel_size;
  if (c.is_actor || c.is_rollout) TESSERA_RETURN_IF_ERROR(parse_actor(actor, dp, c));
  // verl's checkpoint.save_contents: `hf_model` adds an HF directory beside the shards (the
  // driver refuses any other change to the contents).
  if (actor.is_object() && actor.contains("checkpoint") && actor["checkpoint"].is_object()) {
    const json& contents = actor["checkpoint"].value("save_contents", json::array());
    c.save_hf_model = contents.is_array() && std::find(contents.begin(), contents.end(), "hf_model") != contents.end();
  }
  if (c.is_actor) {
    TESSERA_RETURN_IF_ERROR(normalize_log_prob_micro(c.rollout.log_prob_micro_batch_size,
                                                     c.rollout.log_prob_micro_batch_size_per_gpu,
                                                     c.rollout.log_prob_use_dynamic_bsz, dp_groups,
                                                     std::string(kPath) + ".rollout."));
  }
  TESSERA_ASSIGN_OR_RETURN(c.ref, parse_ref(ref));
  if (c.is_ref) {
    TESSERA_RETURN_IF_ERROR(normalize_log_prob_micro(c.ref.log_prob_micro_batch_size,
                                                     c.ref.log_prob_micro_batch_size_per_gpu,
                                                     c.ref.log_prob_use_dynamic_bsz, dp_groups,
                                                     std::string(kPath) + ".ref."));
    const int64_t ref_sp = c.ref.ulysses_sequence_parallel_size;
    if (ref_sp != 1 && ref_sp != c.ulysses_sequence_parallel_size) {
      return make_error(ErrorCode::invalid_argument,
                        "{0}.ref.ulysses_sequence_parallel_size = {1} must be 1 or {0}.actor.ulysses_sequence_parallel_size"
                        " = {2}: the reference runs in the actor's sequence-parallel groups",
                        kPath, ref_sp, c.ulysses_sequence_parallel_size);
    }
  }
  return c;
}

namespace {

Result<std::vector<int64_t>> ids_from(const json& v, const std::string& where) {
  std::vector<int64_t> ids;
  if (v.is_number_integer()) ids.push_back(v.get<int64_t>());
  else if (v.is_array()) {
    for (const auto& x : v) {
      if (!x.is_number_integer()) return make_error(ErrorCode::invalid_argument, "{}: eos_token_id {} is not an integer", where, x.dump());
      ids.push_back(x.get<int64_t>());
    }
  } else if (!v.is_null()) {
    return make_error(ErrorCode::invalid_argument, "{}: eos_token_id {} is not an integer or a list", where, v.dump());
  }
  return ids;
}

}  // namespace

Result<GenerationTokens> generation_tokens(const std::string& model_dir, const models::ModelConfig& config) {
  GenerationTokens t;
  t.eos_token_ids = config.eos_token_ids;
  std::optional<int64_t> pad = config.pad_token_id;
  const std::string gen_path = (std::filesystem::path(model_dir) / "generation_config.json").string();
  if (std::filesystem::exists(gen_path)) {
    std::ifstream in(gen_path);
    json g = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (g.is_discarded() || !g.is_object()) {
      return make_error(ErrorCode::corrupt_data, "{}: not a JSON object", gen_path);
    }
    TESSERA_ASSIGN_OR_RETURN(auto ids, ids_from(g.value("eos_token_id", json()), gen_path));
    if (!ids.empty()) t.eos_token_ids = ids;
    if (g.contains("pad_token_id") && g["pad_token_id"].is_number_integer()) pad = g["pad_token_id"].get<int64_t>();
  }
  if (t.eos_token_ids.empty()) {
    return make_error(ErrorCode::invalid_argument, "{}: the model has no eos_token_id (config.json or generation_config.json)",
                      model_dir);
  }
  t.pad_token_id = pad.value_or(t.eos_token_ids.front());
  return t;
}

}  // namespace tessera::workers
