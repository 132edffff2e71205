// agent_loops.cpp: see agent_loops.hpp.
//
// Note [Custom agent loops]
// verl 0.5's agent-loop rollout runs each row's loop (agent_name picks it from a registry that
// agent.agent_loop_config_path extends) in AgentLoopWorker processes, which send every
// server_manager.generate call to a vLLM/SGLang server. Here the loops run as verl runs them, in
// one Python process per rollout rank (agent_host.hpp), and their generate calls reach the
// in-process engine:
//  - The loops' requests are batched: the host sends its queue when every unfinished loop waits
//    on the model, when none asked for 50 ms, or when the oldest has waited 200 ms; each batch is one engine call per distinct
//    sampling rule (continuous batching, CUDA-graph decode, within it). Requests that come while
//    the engine runs wait for the next batch, where vLLM would admit them at its next step.
//  - A request generates until EOS or its budget: min(response_length, max_model_len (at most the
//    model's context) minus its prompt, its sampling_params' max_tokens / max_new_tokens); a
//    prompt that leaves no room fails its request. verl 0.5's vLLM server allows
//    max_model_len minus the prompt (and raises on max_tokens), its SGLang server caps at
//    response_length as here; a loop cuts its own response to response_length, as verl's do.
//  - sampling_params are the loop's: verl's dict (temperature, top_p, repetition_penalty: 1.0;
//    val_kwargs' when validating) plus top_k, built from the config as the engine reads it
//    (do_sample=false: temperature 0). A loop may change temperature, top_p, top_k and the budget
//    per request; another key, or a repetition_penalty other than 1, fails that request with an
//    exception in the loop naming the key.
//  - Request k of row r samples from stream r + k x rows of the call's seed: tokens do not depend
//    on how the requests were batched, and a resumed run samples as an uninterrupted one.
//  - The output is verl's _postprocess of the loops' AgentLoopOutputs: the prompt left-padded to
//    prompt_length, the response right-padded to response_length, response_mask the loop's
//    (times the attention mask), __num_turns__ its num_turns. A loop that returns a longer prompt
//    or response, a mask of another length or token ids outside the vocabulary is an error naming
//    the row and its loop (verl would build a ragged batch or fail in the actor). A loop that
//    raises stops the rollout naming the row, as verl's gather does.
//  - verl's agent-loop timing metrics (timing_s/agent_loop/{generate_sequences,tool_calls}/
//    {min,max,mean} and the slowest row's) come from the loops' AgentLoopMetrics.
#include "workers/rollout/agent_loops.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "workers/rollout/contract.hpp"
#include "workers/rollout/sampling.hpp"

namespace tessera::rollout {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char* kKey = "actor_rollout_ref.rollout.agent.agent_loop_config_path";

// One generate() request, ready for the engine.
struct Request {
  size_t index;  ///< In the host's message.
  int64_t row;
  std::vector<int64_t> prompt;
  int64_t budget;
  SamplingParams sampling;
};

// Token ids as a JSON array of ints in [0, vocab); an error names `what`.
Result<std::vector<int64_t>> token_ids(const json& v, int64_t vocab, const std::string& what) {
  if (!v.is_array()) return make_error(ErrorCode::invalid_argument, "{} is not a list of token ids", what);
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (const auto& t : v) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab) {
      return make_error(ErrorCode::invalid_argument, "{} holds {}, not a token id of the model's vocabulary ({})", what,
                        t.dump().substr(0, 40), vocab);
    }
    out.push_back(t.get<int64_t>());
  }
  return out;
}

// A loop's sampling_params as the engine's rule and a token budget cap (0: none). An error names
// the key: the loop gets it as an exception.
Result<std::pair<SamplingParams, int64_t>> read_sampling(const json& params) {
  if (!params.is_object()) return make_error(ErrorCode::invalid_argument, "sampling_params is not a mapping");
  SamplingParams s;
  int64_t cap = 0;
  for (const auto& [key, value] : params.items()) {
    const std::string where = "sampling_params." + key;
    if (key == "temperature" || key == "top_p" || key == "repetition_penalty") {
      if (!value.is_number()) return make_error(ErrorCode::invalid_argument, "{}={} is not a number", where, value.dump());
      const double x = value.get<double>();
      if (key == "temperature" && !(x >= 0)) {
        return make_error(ErrorCode::invalid_argument, "{}={} must be >= 0", where, x);
      }
      if (key == "top_p" && !(x > 0 && x <= 1)) {
        return make_error(ErrorCode::invalid_argument, "{}={} must be in (0, 1]", where, x);
      }
      if (key == "repetition_penalty" && x != 1.0) {
        return make_error(ErrorCode::unimplemented, "{}={}: Tessera's engine has no repetition penalty (1.0 only)",
                          where, x);
      }
      if (key == "temperature") s.temperature = x;
      if (key == "top_p") s.top_p = x;
    } else if (key == "top_k" || key == "max_tokens" || key == "max_new_tokens") {
      if (!value.is_number_integer()) {
        return make_error(ErrorCode::invalid_argument, "{}={} is not an integer", where, value.dump());
      }
      const int64_t n = value.get<int64_t>();
      if (key == "top_k") {
        if (n < -1) return make_error(ErrorCode::invalid_argument, "{}={} must be >= -1", where, n);
        s.top_k = n;
      } else {
        if (n < 1) return make_error(ErrorCode::invalid_argument, "{}={} must be >= 1", where, n);
        cap = cap == 0 ? n : std::min(cap, n);
      }
    } else {
      return make_error(ErrorCode::unimplemented, "{}: not a sampling parameter Tessera's engine takes (temperature, "
                        "top_p, top_k, max_tokens, max_new_tokens, repetition_penalty=1.0)", where);
    }
  }
  s.greedy = s.temperature < kSamplingEps;
  return std::make_pair(s, cap);
}

// verl's _performance_metrics over the rows' AgentLoopMetrics, as timing_s/agent_loop/*.
json agent_loop_metrics(const std::vector<json>& metrics, const std::vector<ConversationTokens>& rows) {
  if (metrics.empty()) return json::object();
  json out = json::object();
  std::vector<double> gen, tools;
  for (const json& m : metrics) {
    gen.push_back(m.is_object() && m.value("generate_sequences", json()).is_number() ? m["generate_sequences"].get<double>() : 0.0);
    tools.push_back(m.is_object() && m.value("tool_calls", json()).is_number() ? m["tool_calls"].get<double>() : 0.0);
  }
  for (const auto& [name, v] : {std::pair<const char*, const std::vector<double>&>{"generate_sequences", gen},
                                {"tool_calls", tools}}) {
    double sum = 0;
    for (double x : v) sum += x;
    out[fmt::format("timing_s/agent_loop/{}/min", name)] = *std::min_element(v.begin(), v.end());
    out[fmt::format("timing_s/agent_loop/{}/max", name)] = *std::max_element(v.begin(), v.end());
    out[fmt::format("timing_s/agent_loop/{}/mean", name)] = sum / static_cast<double>(v.size());
  }
  size_t slowest = 0;
  for (size_t i = 1; i < gen.size(); ++i) {
    if (gen[i] + tools[i] > gen[slowest] + tools[slowest]) slowest = i;
  }
  out["timing_s/agent_loop/slowest/generate_sequences"] = gen[slowest];
  out["timing_s/agent_loop/slowest/tool_calls"] = tools[slowest];
  out["timing_s/agent_loop/slowest/prompt_length"] = static_cast<double>(rows[slowest].prompt.size());
  out["timing_s/agent_loop/slowest/response_length"] = static_cast<double>(rows[slowest].response.size());
  return out;
}

}  // namespace

Result<std::unique_ptr<AgentLoopRollout>> AgentLoopRollout::create(const RolloutConfig& config,
                                                                   std::unique_ptr<AgentLoops> loops,
                                                                   int64_t vocab_size, int64_t context_length) {
  if (config.mode != "async" || !config.agent_loop_config_path || loops == nullptr || vocab_size < 1 ||
      context_length < 1) {
    return make_error(ErrorCode::invalid_argument, "{}: custom agent loops need mode=async, the config path and their "
                      "host", kKey);
  }
  return std::unique_ptr<AgentLoopRollout>(new AgentLoopRollout(config, std::move(loops), vocab_size, context_length));
}

Result<proto::DataProto> AgentLoopRollout::generate(RolloutEngine& engine, const proto::DataProto& prompts) {
  const auto t0 = Clock::now();
  stats_ = AgentLoopStats{};
  TESSERA_ASSIGN_OR_RETURN(GenerationInputs in, read_generation_inputs(prompts, config_.do_sample));
  const int64_t bs = prompts.size();
  stats_.rows = bs;
  if (bs == 0) return build_generation_output(prompts, in, {}, config_.response_length, false);
  auto raw = prompts.column("raw_prompt");
  if (!raw.ok() || raw->type() != proto::ColumnType::json) {
    return make_error(ErrorCode::invalid_argument, "{}: the batch has no raw_prompt column of chat messages (set "
                      "data.return_raw_chat=true)", kKey);
  }
  auto agent_column = prompts.column("agent_name");
  if (agent_column.ok() && agent_column->type() != proto::ColumnType::string) {
    return make_error(ErrorCode::invalid_argument, "the batch's agent_name column holds {} values, not strings",
                      proto::to_string(agent_column->type()));
  }
  auto index_column = prompts.column("index");
  const std::vector<std::string>& agents = loops_->agents();
  json rows = json::array();
  std::vector<std::string> names;
  for (int64_t r = 0; r < bs; ++r) {
    const std::string name = agent_column.ok() ? agent_column->str(r) : "single_turn_agent";
    if (std::find(agents.begin(), agents.end(), name) == agents.end()) {
      return make_error(ErrorCode::invalid_argument, "row {}: agent_name '{}' is not an agent loop of {} or verl's ({})",
                        r, name, kKey, fmt::join(agents, ", "));
    }
    json index = r;
    if (index_column.ok() && index_column->type() == proto::ColumnType::int64) index = index_column->i64(r);
    rows.push_back({{"agent_name", name}, {"messages", raw->json_value(r)}, {"index", index}});
    names.push_back(name);
  }
  // verl's dict, with top_k, from the rule the engine would apply (see the Note).
  const SamplingParams rule = resolve_sampling(config_, in.do_sample, in.validate);
  const json sampling_params = {{"temperature", rule.greedy ? 0.0 : rule.temperature},
                                {"top_p", rule.top_p},
                                {"top_k", rule.top_k},
                                {"repetition_penalty", 1.0}};
  const json& meta = prompts.meta_info();
  const json batch = {{"rows", std::move(rows)},
                      {"sampling_params", sampling_params},
                      {"step", meta.contains("global_steps") && meta["global_steps"].is_number_integer()
                                   ? meta["global_steps"].get<int64_t>() : -1},
                      {"validate", in.validate}};
  const uint64_t seed = engine.call_seed(meta);
  // What a request's prompt and tokens may fill: max_model_len, within the model's context.
  const int64_t max_model_len =
      std::min(config_.max_model_len.value_or(config_.prompt_length + config_.response_length), context_length_);
  std::vector<int64_t> calls_of(static_cast<size_t>(bs), 0);  // each row's generate() calls so far

  // A loop's next request usually starts with its last one's sequence (Note [Prefix cache]).
  EngineSession session(engine, config_.enable_prefix_caching, bs);
  TESSERA_ASSIGN_OR_RETURN(json message, loops_->start(batch));
  while (message.value("op", "") == "generate") {
    const json& requests = message["requests"];
    json results = json::array();
    std::map<std::tuple<bool, double, int64_t, double>, std::vector<Request>> groups;  // by sampling rule
    for (size_t k = 0; k < requests.size(); ++k) {
      const json& q = requests[k];
      const int64_t r = q.is_object() && q.value("row", json()).is_number_integer() ? q["row"].get<int64_t>() : -1;
      if (r < 0 || r >= bs) {
        return make_error(ErrorCode::internal, "{}: the agent-loop process sent a request for row {}", kKey, r);
      }
      results.push_back(json::object());
      auto prompt = token_ids(q.value("prompt_ids", json()), vocab_size_, "prompt_ids");
      auto sampling = read_sampling(q.value("sampling_params", json()));
      if (!prompt.ok() || !sampling.ok()) {
        results[k]["error"] = (!prompt.ok() ? prompt.status() : sampling.status()).message();
        continue;
      }
      const auto n = static_cast<int64_t>(prompt->size());
      int64_t budget = std::min(config_.response_length, max_model_len - n);
      if (sampling->second > 0) budget = std::min(budget, sampling->second);
      if (n == 0 || budget < 1) {
        results[k]["error"] = fmt::format("prompt_ids has {} tokens: no room to generate under max_model_len={}", n,
                                          max_model_len);
        continue;
      }
      const SamplingParams& s = sampling->first;
      groups[{s.greedy, s.temperature, s.top_k, s.top_p}].push_back(
          {k, r, std::move(prompt).value(), budget, s});
    }
    for (auto& [key, group] : groups) {
      TokenRequests call;
      for (Request& q : group) {
        call.prompts.push_back(std::move(q.prompt));
        call.max_tokens.push_back(q.budget);
        call.streams.push_back(q.row + bs * calls_of[static_cast<size_t>(q.row)]++);
      }
      call.eos_token_ids = in.eos_token_ids;
      call.validate = in.validate;
      call.seed = seed;
      call.sampling = group.front().sampling;
      call.sampling->fused = config_.sampler == "fused";
      TESSERA_ASSIGN_OR_RETURN(std::vector<GeneratedRow> generated, engine.generate_tokens(call));
      add_generation_stats(stats_.generation, engine.last_stats());
      stats_.engine_calls += 1;
      stats_.requests += static_cast<int64_t>(group.size());
      for (size_t i = 0; i < group.size(); ++i) results[group[i].index]["tokens"] = std::move(generated[i].tokens);
    }
    TESSERA_ASSIGN_OR_RETURN(message, loops_->answer({{"results", std::move(results)}}));
  }

  // The loops' AgentLoopOutputs (message: {"op": "done", "rows": [...]}).
  const json& done = message["rows"];
  if (static_cast<int64_t>(done.size()) != bs) {
    return make_error(ErrorCode::internal, "{}: the agent-loop process returned {} rows for {}", kKey, done.size(), bs);
  }
  std::vector<ConversationTokens> outputs;
  std::vector<json> metrics;
  for (int64_t r = 0; r < bs; ++r) {
    const json& o = done[static_cast<size_t>(r)];
    const std::string loop = fmt::format("row {}: agent loop '{}'", r, names[static_cast<size_t>(r)]);
    if (o.contains("error")) return make_error(ErrorCode::internal, "{} failed: {}", loop, o["error"].dump());
    ConversationTokens c;
    auto fail = [&](const Status& st) { return Status(st.code(), loop + " returned " + st.message()); };
    auto prompt = token_ids(o.value("prompt_ids", json()), vocab_size_, "prompt_ids");
    auto response = token_ids(o.value("response_ids", json()), vocab_size_, "response_ids");
    if (!prompt.ok()) return fail(prompt.status());
    if (!response.ok()) return fail(response.status());
    c.prompt = std::move(prompt).value();
    c.response = std::move(response).value();
    if (c.prompt.empty() || static_cast<int64_t>(c.prompt.size()) > config_.prompt_length) {
      return make_error(ErrorCode::out_of_range, "{} returned a prompt of {} tokens; actor_rollout_ref.rollout."
                        "prompt_length (data.max_prompt_length) is {}", loop, c.prompt.size(), config_.prompt_length);
    }
    if (static_cast<int64_t>(c.response.size()) > config_.response_length) {
      return make_error(ErrorCode::out_of_range, "{} returned a response of {} tokens; actor_rollout_ref.rollout."
                        "response_length (data.max_response_length) is {}: the loop cuts its response, as verl's do",
                        loop, c.response.size(), config_.response_length);
    }
    const json& mask = o.value("response_mask", json());
    if (!mask.is_array() || mask.size() != c.response.size()) {
      return make_error(ErrorCode::invalid_argument, "{} returned a response_mask of {} values for {} response tokens",
                        loop, mask.is_array() ? mask.size() : 0, c.response.size());
    }
    for (const auto& m : mask) {
      if (!m.is_number_integer() || (m.get<int64_t>() != 0 && m.get<int64_t>() != 1)) {
        return make_error(ErrorCode::invalid_argument, "{} returned a response_mask holding {} (0 or 1 only)", loop,
                          m.dump().substr(0, 40));
      }
      c.mask.push_back(m.get<int64_t>());
    }
    c.num_turns = o.value("num_turns", json()).is_number_integer() ? o["num_turns"].get<int64_t>() : 0;
    metrics.push_back(o.value("metrics", json::object()));
    outputs.push_back(std::move(c));
  }
  stats_.metrics = agent_loop_metrics(metrics, outputs);
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto out, build_conversation_output(prompts, in, outputs, config_.prompt_length,
                                                                           config_.response_length, false));
  stats_.generation.total_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return out;
}

}  // namespace tessera::rollout
