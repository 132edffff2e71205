// multi_turn.cpp: see multi_turn.hpp.
//
// Note [Multi-turn rollout]
// verl v0.5.0 has two multi-turn loops with the same keys: the SGLang rollout's (sync mode, which
// users of `multi_turn.enable` run) and the async agent loop's ToolAgentLoop. Tessera follows the
// SGLang rollout's tool lifecycle and the agent loop's token handling:
//  - The prompt is the row's raw_prompt rendered with the chat template, the offered tools'
//    schemas and the generation prompt (the dataset's input_ids are not used: they lack the tools).
//    A row offers the tools named in its tools_kwargs (SGLang); a row with none offers every tool
//    of the config (the agent loop), since offering none would make the rollout single-turn.
//  - Each offered tool gets an instance per row before the first turn (create with the row's
//    create_kwargs) and, after the last one, calc_reward and release; the rewards form the row's
//    reward_scores (SGLang).
//  - A turn generates until EOS or the row's budget. The tokens are kept as sampled: verl's SGLang
//    rollout decodes the assistant's text and tokenizes it again through the chat template, which
//    can change tokens (hence its tokenization_sanity_check_mode); the agent loop and Tessera train
//    on exactly what was sampled.
//  - The turn's text is decoded and its <tool_call>{"name": ..., "arguments": {...}}</tool_call>
//    blocks (hermes) parsed; a block that is not such JSON, or names a tool the row was not offered,
//    is dropped and counted. The first max_parallel_calls calls run, every row's at once, through
//    the tool host. A tool that raises ends its row (the agent loop); the error is counted.
//  - Each answer (its text cut to max_tool_response_length characters, "...(truncated)" marking
//    the cut on the side tool_response_truncate_side names) becomes a {"role": "tool"} message;
//    the answers of a turn are rendered alone with the generation prompt, the template's preamble
//    (its rendering of [{}], e.g. Qwen2.5's default system turn) removed, and appended with
//    response_mask 0 (the agent loop).
//  - Interactions (multi_turn.interaction_config_path; SGLang's INTERACTING): a row with
//    interaction_kwargs starts the interaction they name; after a turn without tool calls, while
//    fewer than max_user_turns replies were given, generate_response reads the conversation
//    ({role, content}; a turn that called tools as its text before the first call) and its reply
//    either ends the row or is appended as a user turn, like tool answers; the rewards are
//    reward_scores' user_turn_rewards. finalize_interaction runs at the end (verl 0.5.0 leaves it uncalled).
//  - A row ends when it generated no call (and no interaction replies), its last turn hit the
//    budget instead of EOS, it reached max_assistant_turns (default max_model_len / 3, as SGLang;
//    max_user_turns, same default, caps the interaction's replies), or the next tool answer or
//    user turn would fill the response: the response never ends on one, so GAE's last token is
//    the model's.
//  - A row's schemas are listed in the tool config's order. A prompt that no longer fits
//    prompt_length once they are in is an error naming the row (verl's SGLang rollout warns and
//    widens the batch).
//  - Every turn's generation is one engine call over the live rows; row r samples from stream r of
//    a seed derived from the call's seed and the turn, so the rollout is reproducible and a resumed
//    run samples as an uninterrupted one.
//
// Note [Agent loops]
// rollout.mode=async is verl's agent-loop rollout (verl/experimental/agent_loop). Its servers and
// agent-loop workers are processes around vLLM/SGLang; here the loops run on the in-process engine,
// each turn batched over the live rows as above. Per row, agent_name picks the loop:
//  - single_turn_agent (also when the batch has no agent_name): raw_prompt rendered without tools,
//    one generation, __num_turns__ 2.
//  - tool_agent (ToolAgentLoop): every tool offered, its schema dumped without unset and None
//    fields (the agent loop's model_dump(exclude_unset=True, exclude_none=True)); each call
//    creates a fresh instance, executes and releases it (no create/execute kwargs, no
//    calc_reward, no reward_scores); unset turn limits are no limits. Everything else (hermes
//    parsing, max_parallel_calls, truncation, masks, stop rules) is as in the SGLang loop above,
//    which took it from the agent loop, except that a call to a tool it does not have ends the
//    row (verl's KeyError) before the turn's other calls run (verl runs them, then ends it).
#include "workers/rollout/multi_turn.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <mutex>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "workers/rollout/contract.hpp"
#include "workers/rollout/sampling.hpp"

namespace tessera::rollout {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

constexpr const char* kKey = "actor_rollout_ref.rollout.multi_turn";

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One sequence's state.
struct Conversation {
  std::vector<int64_t> ids;       ///< Prompt, then the response so far.
  int64_t prompt_length = 0;
  std::vector<int64_t> mask;      ///< Per response token: 1 generated, 0 tool answer.
  std::vector<float> logprobs;    ///< Per response token (with calculate_log_probs); -1 on tool answers.
  std::vector<std::string> tools; ///< The tools offered, in the config's order.
  bool single_turn = false;       ///< The agent loops' single_turn_agent: one generation.
  json tools_kwargs = json::object();
  std::string interaction;        ///< The interaction (simulated user) of the row; empty: none.
  json interaction_kwargs = json::object();
  nlohmann::ordered_json messages;  ///< The conversation as {role, content} (what interactions read).
  json user_turn_rewards = json::array();
  int64_t assistant_turns = 0, tool_turns = 0, interaction_turns = 0;
  bool done = false;
  int64_t response_length() const { return static_cast<int64_t>(mask.size()); }
};

struct Call {
  size_t row;
  std::string tool;
  json arguments;
};

// Number of Unicode code points of UTF-8 text (Python's len), and the byte offset of code point k.
size_t code_points(const std::string& s) {
  return static_cast<size_t>(std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}
size_t byte_offset(const std::string& s, size_t k) {
  size_t seen = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((s[i] & 0xC0) != 0x80 && seen++ == k) return i;
  }
  return s.size();
}

// verl's agent loop: keep max characters of the answer, marking the cut.
std::string truncate_answer(const std::string& text, size_t max, const std::string& side) {
  const size_t n = code_points(text);
  if (n <= max) return text;
  if (side == "left") return text.substr(0, byte_offset(text, max)) + "...(truncated)";
  if (side == "right") return "(truncated)..." + text.substr(byte_offset(text, n - max));
  const size_t half = max / 2;
  return text.substr(0, byte_offset(text, half)) + "...(truncated)..." + text.substr(byte_offset(text, n - half));
}

// The hermes blocks of `text`: <tool_call>...</tool_call>, non-greedy, as verl's HermesToolParser.
std::vector<std::string> hermes_blocks(const std::string& text) {
  static constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";
  std::vector<std::string> out;
  size_t at = 0;
  while (true) {
    const size_t open = text.find(kOpen, at);
    if (open == std::string::npos) break;
    const size_t close = text.find(kClose, open + kOpen.size());
    if (close == std::string::npos) break;
    out.push_back(text.substr(open + kOpen.size(), close - open - kOpen.size()));
    at = close + kClose.size();
  }
  return out;
}

// The text before its first <tool_call>, stripped: SGLang's hermes/Qwen2.5 parser's "normal
// text" of a turn that calls tools (the whole text otherwise).
std::string without_tool_calls(const std::string& text) {
  const size_t open = text.find("<tool_call>");
  if (open == std::string::npos) return text;
  static constexpr const char* kSpace = " \t\n\r";
  const size_t first = text.find_first_not_of(kSpace);
  if (first == std::string::npos || first >= open) return std::string();
  return text.substr(first, text.find_last_not_of(kSpace, open - 1) - first + 1);
}

json kwargs_of(const json& tools_kwargs, const std::string& tool, const char* which) {
  if (!tools_kwargs.contains(tool)) return json::object();
  const json& entry = tools_kwargs[tool];
  if (!entry.is_object() || !entry.contains(which) || entry[which].is_null()) return json::object();
  return entry[which];
}

constexpr const char* kKwargKeys[] = {"create_kwargs", "execute_kwargs", "calc_reward_kwargs", "release_kwargs"};

// tools_kwargs.<tool> must be a mapping whose *_kwargs are mappings (Python passes them as **).
Status check_tool_kwargs(const json& entry, const std::string& tool, int64_t row) {
  if (entry.is_null()) return Status();
  if (!entry.is_object()) {
    return make_error(ErrorCode::invalid_argument, "row {}: tools_kwargs.{} is not a mapping: {}", row, tool,
                      entry.dump().substr(0, 80));
  }
  for (const char* which : kKwargKeys) {
    if (entry.contains(which) && !entry[which].is_null() && !entry[which].is_object()) {
      return make_error(ErrorCode::invalid_argument, "row {}: tools_kwargs.{}.{} is not a mapping: {}", row, tool, which,
                        entry[which].dump().substr(0, 80));
    }
  }
  return Status();
}

std::vector<int64_t> to_int64(const std::vector<int32_t>& ids) { return {ids.begin(), ids.end()}; }

}  // namespace

MultiTurnRollout::MultiTurnRollout(const RolloutConfig& config, std::shared_ptr<const tokenizer::Tokenizer> tokenizer,
                                   std::shared_ptr<const tokenizer::ChatTemplate> chat, std::unique_ptr<ToolSet> tools,
                                   std::string preamble)
    : config_(config),
      tokenizer_(std::move(tokenizer)),
      chat_(std::move(chat)),
      tools_(std::move(tools)),
      preamble_(std::move(preamble)),
      agent_(config.mode == "async") {}

Result<std::unique_ptr<MultiTurnRollout>> MultiTurnRollout::create(const RolloutConfig& config,
                                                                   std::shared_ptr<const tokenizer::Tokenizer> tokenizer,
                                                                   std::shared_ptr<const tokenizer::ChatTemplate> chat,
                                                                   std::unique_ptr<ToolSet> tools) {
  const bool agent = config.mode == "async";
  if (!(config.multi_turn.enable || agent) || tokenizer == nullptr || chat == nullptr || (tools == nullptr && !agent)) {
    return make_error(ErrorCode::invalid_argument, "{}: the multi-turn rollout needs enable=true (or mode=async), a "
                      "tokenizer, a chat template and the tools", kKey);
  }
  if (tools != nullptr && chat->format() != tokenizer::ChatFormat::jinja) {
    return make_error(ErrorCode::invalid_argument, "{}: tool schemas need the model's Jinja chat template (or "
                      "actor_rollout_ref.model.custom_chat_template)", kKey);
  }
  TESSERA_ASSIGN_OR_RETURN(std::string preamble, chat->preamble());
  return std::unique_ptr<MultiTurnRollout>(
      new MultiTurnRollout(config, std::move(tokenizer), std::move(chat), std::move(tools), std::move(preamble)));
}

Result<proto::DataProto> MultiTurnRollout::generate(RolloutEngine& engine, const proto::DataProto& prompts) {
  const auto t0 = Clock::now();
  stats_ = MultiTurnStats{};
  const int64_t call = calls_++;
  TESSERA_ASSIGN_OR_RETURN(GenerationInputs in, read_generation_inputs(prompts, config_.do_sample));
  const int64_t bs = prompts.size();
  stats_.rows = bs;
  if (bs == 0) return build_generation_output(prompts, in, {}, config_.response_length, config_.calculate_log_probs);
  auto raw = prompts.column("raw_prompt");
  if (!raw.ok() || raw->type() != proto::ColumnType::json) {
    return make_error(ErrorCode::invalid_argument, "{}: the batch has no raw_prompt column of chat messages (set "
                      "data.return_raw_chat=true)", agent_ ? "actor_rollout_ref.rollout.mode=async" : kKey);
  }
  auto interactions_column = prompts.column("interaction_kwargs");
  if (interactions_column.ok() && interactions_column->type() != proto::ColumnType::json) {
    return make_error(ErrorCode::invalid_argument, "the batch's interaction_kwargs column holds {} values, not JSON "
                      "mappings", proto::to_string(interactions_column->type()));
  }
  auto agent_column = prompts.column("agent_name");
  if (agent_ && agent_column.ok() && agent_column->type() != proto::ColumnType::string) {
    return make_error(ErrorCode::invalid_argument, "the batch's agent_name column holds {} values, not strings",
                      proto::to_string(agent_column->type()));
  }
  auto kwargs_column = prompts.column("tools_kwargs");
  if (kwargs_column.ok() && kwargs_column->type() != proto::ColumnType::json) {
    return make_error(ErrorCode::invalid_argument, "the batch's tools_kwargs column holds {} values, not JSON mappings",
                      proto::to_string(kwargs_column->type()));
  }
  const MultiTurnConfig& mt = config_.multi_turn;
  const int64_t max_model_len = config_.max_model_len.value_or(config_.prompt_length + config_.response_length);
  // Unset turn limits: max_model_len / 3 in verl's SGLang rollout, none in its agent loop.
  const int64_t unset_limit = agent_ ? std::numeric_limits<int64_t>::max() : max_model_len / 3;
  const int64_t max_assistant = mt.max_assistant_turns.value_or(unset_limit);
  const int64_t max_user = mt.max_user_turns.value_or(unset_limit);
  const int64_t R = config_.response_length;

  // Prompts: the messages with the offered tools' schemas.
  std::vector<Conversation> rows(static_cast<size_t>(bs));
  for (int64_t r = 0; r < bs; ++r) {
    Conversation& c = rows[static_cast<size_t>(r)];
    const json& messages = raw->json_value(r);
    if (kwargs_column.ok()) {
      const json& kw = kwargs_column->json_value(r);
      if (!kw.is_null() && !kw.is_object()) {
        return make_error(ErrorCode::invalid_argument, "row {}: tools_kwargs is not a mapping: {}", r,
                          kw.dump().substr(0, 80));
      }
      if (kw.is_object()) c.tools_kwargs = kw;
    }
    ordered_json schemas = ordered_json::array();
    if (agent_) {
      // verl's agent loops: single_turn_agent (the default) renders no tools; tool_agent offers
      // every tool and creates an instance per call.
      const std::string name = agent_column.ok() ? agent_column->str(r) : "single_turn_agent";
      if (name == "single_turn_agent") {
        c.single_turn = true;
      } else if (name == "tool_agent") {
        if (tools_ != nullptr) {
          for (const auto& [tool, schema] : tools_->agent_schemas().items()) {
            c.tools.push_back(tool);
            schemas.push_back(schema);
          }
        }
      } else {
        return make_error(ErrorCode::invalid_argument,
                          "row {}: agent_name '{}' is not an agent loop Tessera runs (single_turn_agent, tool_agent)",
                          r, name);
      }
    } else {
      // verl: a row with interaction_kwargs talks to the interaction they name ("gsm8k" by default).
      if (interactions_column.ok() && tools_ != nullptr && !tools_->interactions().empty()) {
        const json& kw = interactions_column->json_value(r);
        if (!kw.is_null() && !kw.is_object()) {
          return make_error(ErrorCode::invalid_argument, "row {}: interaction_kwargs is not a mapping: {}", r,
                            kw.dump().substr(0, 80));
        }
        if (kw.is_object() && !kw.empty()) {
          c.interaction_kwargs = kw;
          if (kw.contains("name") && !kw["name"].is_string()) {
            return make_error(ErrorCode::invalid_argument, "row {}: interaction_kwargs.name is not a string: {}", r,
                              kw["name"].dump().substr(0, 80));
          }
          c.interaction = kw.value("name", "gsm8k");
          if (!tools_->has_interaction(c.interaction)) {
            return make_error(ErrorCode::invalid_argument, "row {}: interaction_kwargs names interaction '{}', which "
                              "{}.interaction_config_path does not define", r, c.interaction, kKey);
          }
        }
      }
      if (tools_->schemas().empty()) c.tools_kwargs = json::object();  // no tools: verl reads none
      for (const auto& [name, entry] : c.tools_kwargs.items()) {
        if (!tools_->has_tool(name)) {
          return make_error(ErrorCode::invalid_argument, "row {}: tools_kwargs names tool '{}', which "
                            "{}.tool_config_path does not define", r, name, kKey);
        }
        TESSERA_RETURN_IF_ERROR(check_tool_kwargs(entry, name, r));
      }
      for (const auto& [name, schema] : tools_->schemas().items()) {
        if (c.tools_kwargs.empty() || c.tools_kwargs.contains(name)) {
          c.tools.push_back(name);
          schemas.push_back(schema);
        }
      }
    }
    // verl: the SGLang rollout passes no tools (None) when a row has none, the tool agent its list.
    const bool tools_arg = agent_ ? !c.single_turn : !schemas.empty();
    Result<std::string> text = chat_->render_json(ordered_json(messages), tools_arg ? schemas : ordered_json(), true);
    if (!text.ok()) return make_error(text.status().code(), "row {}: raw_prompt: {}", r, text.status().message());
    if (!c.interaction.empty()) {  // the conversation as the interaction reads it (checked by the rendering)
      c.messages = ordered_json::array();
      for (const auto& m : messages) c.messages.push_back({{"role", m["role"]}, {"content", m["content"]}});
    }
    TESSERA_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer_->encode(*text));
    if (ids.empty() || static_cast<int64_t>(ids.size()) > config_.prompt_length) {
      return make_error(ErrorCode::out_of_range,
                        "row {}: the prompt rendered with its tools' schemas has {} tokens; "
                        "actor_rollout_ref.rollout.prompt_length (data.max_prompt_length) is {}",
                        r, ids.size(), config_.prompt_length);
    }
    c.ids = to_int64(ids);
    c.prompt_length = static_cast<int64_t>(ids.size());
  }

  // One instance of each offered tool per row. Until the finish batch has run, a return releases
  // the instances created (a tool's state lives as long as its instance).
  const std::string prefix = fmt::format("tessera-{}-{}", ::getpid(), call);
  auto instance = [&](size_t row) { return fmt::format("{}-{}", prefix, row); };
  auto run_tools = [&](const std::string& op, const std::vector<ToolRequest>& batch) -> Result<std::vector<ToolAnswer>> {
    const auto start = Clock::now();
    if (batch.empty()) return std::vector<ToolAnswer>();
    auto answers = tools_->call(op, batch);
    stats_.tool_seconds += seconds_since(start);
    return answers;
  };
  struct ReleaseOnReturn {
    ToolSet* host;
    const char* op;
    std::vector<ToolRequest> created;
    ~ReleaseOnReturn() {
      if (!created.empty()) host->call_best_effort(op, created);  // the error already returns
    }
  } release{tools_.get(), "release", {}}, finalize{tools_.get(), "finalize", {}};
  std::vector<size_t> start_rows;
  if (!agent_) {  // the agent loop creates an instance per call instead
    std::vector<ToolRequest> creates;
    std::vector<size_t> create_rows;
    for (size_t r = 0; r < rows.size(); ++r) {
      for (const std::string& tool : rows[r].tools) {
        creates.push_back({tool, instance(r), json::object(), kwargs_of(rows[r].tools_kwargs, tool, "create_kwargs"),
                           kwargs_of(rows[r].tools_kwargs, tool, "release_kwargs")});
        create_rows.push_back(r);
      }
    }
    TESSERA_ASSIGN_OR_RETURN(std::vector<ToolAnswer> created, run_tools("create", creates));
    std::string failure;
    for (size_t i = 0; i < created.size(); ++i) {
      if (created[i].error.empty()) {
        release.created.push_back(creates[i]);
      } else if (failure.empty()) {
        failure = fmt::format("row {}: tool '{}'.create failed: {}", create_rows[i], creates[i].tool, created[i].error);
      }
    }
    if (!failure.empty()) return make_error(ErrorCode::internal, "{}", failure);
    // The rows' interactions start (verl: start_interaction(request_id, **interaction_kwargs)).
    std::vector<ToolRequest> starts;
    for (size_t r = 0; r < rows.size(); ++r) {
      if (!rows[r].interaction.empty()) {
        starts.push_back({rows[r].interaction, instance(r), json::object(), rows[r].interaction_kwargs});
        start_rows.push_back(r);
      }
    }
    TESSERA_ASSIGN_OR_RETURN(std::vector<ToolAnswer> started, run_tools("start", starts));
    for (size_t i = 0; i < started.size(); ++i) {
      if (started[i].error.empty()) {
        finalize.created.push_back(starts[i]);
      } else if (failure.empty()) {
        failure = fmt::format("row {}: interaction '{}'.start_interaction failed: {}", start_rows[i], starts[i].tool,
                              started[i].error);
      }
    }
    if (!failure.empty()) return make_error(ErrorCode::internal, "{}", failure);
  }

  // Appends a turn that is not the model's (tool answers, an interaction's user message): the
  // messages rendered alone with the generation prompt, the template's preamble removed, with
  // response_mask 0. A turn that would fill the response ends the row instead (false).
  auto append_turn = [&](Conversation& c, const ordered_json& turn_messages) -> Result<bool> {
    TESSERA_ASSIGN_OR_RETURN(std::string text, chat_->render_json(turn_messages, nullptr, true));
    if (text.compare(0, preamble_.size(), preamble_) != 0) {
      return make_error(ErrorCode::internal, "{}: the chat template's rendering of a {} message does not start with "
                        "its preamble; it cannot render such turns alone", kKey,
                        turn_messages.front().value("role", "tool"));
    }
    TESSERA_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer_->encode(text.substr(preamble_.size())));
    if (c.response_length() + static_cast<int64_t>(ids.size()) >= R) {
      c.done = true;
      return false;
    }
    c.ids.insert(c.ids.end(), ids.begin(), ids.end());
    c.mask.insert(c.mask.end(), ids.size(), 0);
    if (config_.calculate_log_probs) c.logprobs.insert(c.logprobs.end(), ids.size(), -1.0F);
    return true;
  };
  // The interactions of `replies` answer the conversation so far (verl's generate_response); each
  // reward joins the row's user_turn_rewards; a reply that does not end it is the next user turn.
  auto interaction_turn = [&](const std::vector<size_t>& replies) -> Status {
    std::vector<ToolRequest> asks;
    for (size_t r : replies) {
      asks.push_back({rows[r].interaction, instance(r), rows[r].messages, rows[r].interaction_kwargs});
    }
    TESSERA_ASSIGN_OR_RETURN(std::vector<ToolAnswer> answers, run_tools("respond", asks));
    for (size_t k = 0; k < replies.size(); ++k) {
      Conversation& c = rows[replies[k]];
      if (!answers[k].error.empty()) {
        return make_error(ErrorCode::internal, "row {}: interaction '{}'.generate_response failed: {}", replies[k],
                          c.interaction, answers[k].error);
      }
      c.user_turn_rewards.push_back(answers[k].reward);
      if (answers[k].terminate) {
        c.done = true;
        continue;
      }
      const ordered_json user = ordered_json::array({{{"role", "user"}, {"content", answers[k].text}}});
      c.messages.push_back(user.front());
      TESSERA_ASSIGN_OR_RETURN(bool appended, append_turn(c, user));
      c.interaction_turns += appended ? 1 : 0;
    }
    return Status();
  };

  const uint64_t seed = engine.call_seed(prompts.meta_info());
  const auto& eos = in.eos_token_ids;
  // Each turn's prompts start with the last turn's sequences (Note [Prefix cache]).
  EngineSession session(engine, config_.enable_prefix_caching, bs);
  for (int64_t turn = 0;; ++turn) {
    TokenRequests requests;
    std::vector<size_t> live;
    for (size_t r = 0; r < rows.size(); ++r) {
      Conversation& c = rows[r];
      if (c.done) continue;
      const int64_t budget = std::min(R - c.response_length(), max_model_len - static_cast<int64_t>(c.ids.size()));
      if (budget < 1) {
        c.done = true;
        continue;
      }
      live.push_back(r);
      requests.prompts.push_back(c.ids);
      requests.max_tokens.push_back(budget);
      requests.streams.push_back(static_cast<int64_t>(r));
    }
    if (live.empty()) break;
    requests.eos_token_ids = eos;
    requests.do_sample = in.do_sample;
    requests.validate = in.validate;
    requests.seed = row_seed(seed, turn);
    TESSERA_ASSIGN_OR_RETURN(std::vector<GeneratedRow> generated, engine.generate_tokens(requests));
    add_generation_stats(stats_.generation, engine.last_stats());
    stats_.assistant_turns += static_cast<int64_t>(live.size());

    std::vector<Call> calls;
    std::vector<size_t> replies;  // rows whose interaction answers this turn
    for (size_t i = 0; i < live.size(); ++i) {
      Conversation& c = rows[live[i]];
      const GeneratedRow& g = generated[i];
      c.ids.insert(c.ids.end(), g.tokens.begin(), g.tokens.end());
      c.mask.insert(c.mask.end(), g.tokens.size(), 1);
      if (config_.calculate_log_probs) c.logprobs.insert(c.logprobs.end(), g.logprobs.begin(), g.logprobs.end());
      c.assistant_turns += 1;
      const bool stopped = !g.tokens.empty() && std::find(eos.begin(), eos.end(), g.tokens.back()) != eos.end();
      const std::vector<int32_t> turn_ids(g.tokens.begin(), g.tokens.end());
      if (!c.interaction.empty()) {  // what the interaction reads: the text, tool calls removed
        TESSERA_ASSIGN_OR_RETURN(std::string content, tokenizer_->decode(turn_ids, {/*skip_special_tokens=*/true, true}));
        c.messages.push_back({{"role", "assistant"}, {"content", without_tool_calls(content)}});
      }
      // The agent loop counts tool turns against max_user_turns; the SGLang loop, interactions.
      if (c.single_turn || c.response_length() >= R || !stopped || c.assistant_turns >= max_assistant ||
          (agent_ && c.tool_turns >= max_user)) {
        c.done = true;
        continue;
      }
      TESSERA_ASSIGN_OR_RETURN(std::string text, tokenizer_->decode(turn_ids));
      const std::vector<std::string> blocks = hermes_blocks(text);
      if (blocks.empty() && text.find("<tool_call>") != std::string::npos) {
        c.done = true;  // an unclosed call: SGLang's parser sees a call, parses none and completes the row
        continue;
      }
      if (blocks.empty()) {
        // No tool call: the row's interaction answers, as long as it may (SGLang's INTERACTING).
        if (!c.interaction.empty() && c.interaction_turns < max_user) {
          replies.push_back(live[i]);
        } else {
          c.done = true;
        }
        continue;
      }
      // A block that is not {"name", "arguments"} JSON is dropped (both loops). A tool the row was
      // not offered: the SGLang loop drops the call; the agent loop counts it and its KeyError ends
      // the row. The agent loop passes any arguments on; SGLang's parser keeps mappings only.
      int64_t parsed = 0;
      bool unknown = false;
      std::vector<Call> row_calls;
      for (const std::string& block : blocks) {
        const json call_json = json::parse(block, nullptr, false);
        const bool well_formed = call_json.is_object() && call_json.contains("name") && call_json["name"].is_string() &&
                                 call_json.contains("arguments") && (agent_ || call_json["arguments"].is_object());
        const std::string name = well_formed ? call_json["name"].get<std::string>() : std::string();
        const bool offered = std::find(c.tools.begin(), c.tools.end(), name) != c.tools.end();
        if (!well_formed || (!agent_ && !offered)) {
          stats_.malformed_calls += 1;
          continue;
        }
        if (parsed++ >= mt.max_parallel_calls) continue;
        if (!offered) {
          unknown = true;
          continue;
        }
        row_calls.push_back({live[i], name, call_json["arguments"]});
      }
      if (unknown) {
        stats_.tool_errors += 1;
        c.done = true;
      } else if (parsed == 0) {
        c.done = true;
      } else {
        calls.insert(calls.end(), row_calls.begin(), row_calls.end());
      }
    }
    TESSERA_RETURN_IF_ERROR(interaction_turn(replies));
    if (calls.empty()) continue;

    std::vector<ToolRequest> executes;
    for (size_t k = 0; k < calls.size(); ++k) {
      const Call& call = calls[k];
      // The agent loop: a fresh instance per call, created before and released after it.
      const std::string id = agent_ ? fmt::format("{}-{}-{}-{}", prefix, call.row, turn, k) : instance(call.row);
      // The agent loop creates and executes with no kwargs.
      executes.push_back({call.tool, id, call.arguments,
                          agent_ ? json::object() : kwargs_of(rows[call.row].tools_kwargs, call.tool, "execute_kwargs")});
    }
    std::vector<ToolAnswer> answers(executes.size());
    if (agent_) {
      TESSERA_ASSIGN_OR_RETURN(std::vector<ToolAnswer> created, run_tools("create", executes));
      std::vector<ToolRequest> made;
      std::vector<size_t> made_index;
      for (size_t k = 0; k < created.size(); ++k) {
        if (!created[k].error.empty()) {
          answers[k] = created[k];
          continue;
        }
        made.push_back(executes[k]);
        made_index.push_back(k);
      }
      release.created = made;
      TESSERA_ASSIGN_OR_RETURN(std::vector<ToolAnswer> executed, run_tools("execute", made));
      release.created.clear();
      TESSERA_ASSIGN_OR_RETURN(std::vector<ToolAnswer> released, run_tools("release", made));
      for (size_t j = 0; j < made.size(); ++j) {  // a failed release fails the call (verl: the batch)
        answers[made_index[j]] = executed[j].error.empty() && !released[j].error.empty() ? released[j] : executed[j];
      }
    } else {
      TESSERA_ASSIGN_OR_RETURN(answers, run_tools("execute", executes));
    }
    stats_.tool_calls += static_cast<int64_t>(calls.size());
    // The answers of each row, in call order.
    std::map<size_t, ordered_json> messages;
    std::map<size_t, bool> failed;
    for (size_t i = 0; i < calls.size(); ++i) {
      const size_t r = calls[i].row;
      if (!answers[i].error.empty()) {
        stats_.tool_errors += 1;
        failed[r] = true;
        continue;
      }
      messages[r].push_back(
          {{"role", "tool"},
           {"content", truncate_answer(answers[i].text, static_cast<size_t>(mt.max_tool_response_length),
                                       mt.tool_response_truncate_side)}});
    }
    for (auto& [r, tool_messages] : messages) {
      Conversation& c = rows[r];
      if (failed.count(r) != 0) {
        c.done = true;
        continue;
      }
      if (!c.interaction.empty()) {
        for (const auto& m : tool_messages) c.messages.push_back(m);
      }
      TESSERA_ASSIGN_OR_RETURN(bool appended, append_turn(c, tool_messages));
      c.tool_turns += appended ? 1 : 0;
    }
    for (auto& [r, f] : failed) rows[r].done = true;
  }

  // calc_reward and release every instance; the rewards are the rows' reward_scores (the agent
  // loop's instances are gone already, and it reports no reward_scores).
  std::vector<ToolRequest> finishes;
  std::vector<size_t> finish_rows;
  for (size_t r = 0; r < rows.size() && !agent_; ++r) {
    for (const std::string& tool : rows[r].tools) {
      finishes.push_back({tool, instance(r), json::object(), kwargs_of(rows[r].tools_kwargs, tool, "calc_reward_kwargs"),
                          kwargs_of(rows[r].tools_kwargs, tool, "release_kwargs")});
      finish_rows.push_back(r);
    }
  }
  release.created.clear();  // the finish batch releases them, also where calc_reward raises
  std::vector<ToolAnswer> finished;
  if (!finishes.empty()) {
    TESSERA_ASSIGN_OR_RETURN(finished, run_tools("finish", finishes));
  }
  // The interactions end (verl 0.5.0 never calls finalize_interaction; its instances would leak).
  // A failure is reported, not fatal: verl's runs never reach that code.
  std::vector<ToolRequest> finals = std::move(finalize.created);
  finalize.created.clear();
  TESSERA_ASSIGN_OR_RETURN(std::vector<ToolAnswer> finalized, run_tools("finalize", finals));
  for (size_t i = 0; i < finalized.size(); ++i) {
    if (!finalized[i].error.empty()) {
      static std::once_flag reported;
      std::call_once(reported, [&] {
        spdlog::warn("{}: interaction '{}'.finalize_interaction failed (reported once): {}", kKey, finals[i].tool,
                     finalized[i].error);
      });
    }
  }
  // As verl's SGLang rollout: {tool: calc_reward, "user_turn_rewards": [each interaction reply's reward]}.
  std::vector<json> reward_scores;
  for (const Conversation& c : rows) reward_scores.push_back(json{{"user_turn_rewards", c.user_turn_rewards}});
  for (size_t i = 0; i < finished.size(); ++i) {
    if (!finished[i].error.empty()) {
      return make_error(ErrorCode::internal, "row {}: tool '{}'.calc_reward/release failed: {}", finish_rows[i],
                        finishes[i].tool, finished[i].error);
    }
    reward_scores[finish_rows[i]][finishes[i].tool] = finished[i].reward;
  }

  // The output batch: prompts left-padded to prompt_length, responses right-padded to R.
  std::vector<ConversationTokens> tokens;
  for (Conversation& c : rows) {
    const auto n = static_cast<std::ptrdiff_t>(c.prompt_length);
    tokens.push_back({std::vector<int64_t>(c.ids.begin(), c.ids.begin() + n),
                      std::vector<int64_t>(c.ids.begin() + n, c.ids.end()), std::move(c.mask), std::move(c.logprobs),
                      c.assistant_turns + c.tool_turns + c.interaction_turns + 1});
  }
  proto::NonTensorBatch added;
  if (!agent_) added.insert_or_assign("reward_scores", proto::Column::jsons(std::move(reward_scores)));
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto out, build_conversation_output(prompts, in, tokens, config_.prompt_length, R,
                                                                           config_.calculate_log_probs, std::move(added)));
  stats_.generation.total_seconds = seconds_since(t0);
  return out;
}

}  // namespace tessera::rollout
