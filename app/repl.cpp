#include "app/repl.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <functional>
#include <map>

#include <torch/torch.h>

#include "app/worker_types.hpp"
#include "driver/config.hpp"
#include "driver/data.hpp"
#include "workers/tokenizer/chat_template.hpp"

namespace tessera::app {
namespace {

using nlohmann::json;

const char* kHelp =
    "commands:\n"
    "  groups                                 worker groups, ranks, devices, hosts, memory\n"
    "  methods GROUP                          a group's methods and dispatch modes\n"
    "  call GROUP METHOD [rows=N] [meta=JSON] [ARG_JSON...]\n"
    "                                         call a method; rows=N passes the next N training\n"
    "                                         rows as a DataProto (first argument)\n"
    "  inspect [rows=K]                       the last DataProto: keys, shapes, K decoded rows\n"
    "  generate \"PROMPT\"                      greedy generation from one user message\n"
    "  step | run N                           one / N training steps; prints their metrics\n"
    "  validate                               the validation metrics now\n"
    "  metrics [PREFIX]                       the last step's metrics (optionally filtered)\n"
    "  save                                   a checkpoint in trainer.default_local_dir\n"
    "  help | quit\n";

// "key=value" words -> map; other words stay positional.
struct Words {
  std::map<std::string, std::string> named;
  std::vector<std::string> positional;
};

Words parse_words(const std::vector<std::string>& words, size_t first,
                  const std::vector<std::string>& names) {
  Words w;
  for (size_t i = first; i < words.size(); ++i) {
    auto eq = words[i].find('=');
    std::string key = eq == std::string::npos ? "" : words[i].substr(0, eq);
    if (!key.empty() && std::find(names.begin(), names.end(), key) != names.end()) {
      w.named[key] = words[i].substr(eq + 1);
    } else {
      w.positional.push_back(words[i]);
    }
  }
  return w;
}

Result<int64_t> parse_count(const std::string& text, const std::string& what) {
  try {
    size_t used = 0;
    long long v = std::stoll(text, &used);
    if (used == text.size() && v >= 1) return static_cast<int64_t>(v);
  } catch (const std::exception&) {
  }
  return make_error(ErrorCode::invalid_argument, "{} must be a positive integer, got '{}'", what, text);
}

Result<json> parse_json_word(const std::string& text, const std::string& what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return make_error(ErrorCode::invalid_argument, "{} is not JSON: {}", what, text);
  return j;
}

// Resident set size of this process in GiB (Linux /proc).
double rss_gib() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)) / (1024.0 * 1024 * 1024);
}

std::string shape_of(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

// The ids of row `r` of an int tensor [B, T] with pad/masked positions removed.
std::vector<int32_t> row_ids(const at::Tensor& ids, int64_t r, std::optional<int32_t> pad) {
  at::Tensor row = ids.select(0, r).to(at::kLong).contiguous();
  std::vector<int32_t> out;
  const int64_t* p = row.data_ptr<int64_t>();
  for (int64_t i = 0; i < row.numel(); ++i) {
    if (pad && p[i] == *pad) continue;
    out.push_back(static_cast<int32_t>(p[i]));
  }
  return out;
}

void print_metrics(std::FILE* out, const driver::Metrics& m, const std::string& prefix) {
  size_t shown = 0;
  for (const auto& [k, v] : m) {
    if (k.compare(0, prefix.size(), prefix) != 0) continue;
    fmt::print(out, "  {:<48} {:.6g}\n", k, v);
    ++shown;
  }
  if (shown == 0) fmt::print(out, "  (no metrics{})\n", prefix.empty() ? "" : " under '" + prefix + "'");
}

}  // namespace

const char* Repl::help() { return kHelp; }

Result<std::vector<std::string>> split_command_line(const std::string& line) {
  std::vector<std::string> words;
  std::string cur;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (quote) {
      if (c == quote) {
        quote = 0;
      } else if (c == '\\' && quote == '"' && i + 1 < line.size()) {
        cur += line[++i];
      } else {
        cur += c;
      }
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      if (in_word) words.push_back(std::move(cur));
      cur.clear();
      in_word = false;
    } else {
      cur += c;
      in_word = true;
    }
  }
  if (quote) return make_error(ErrorCode::invalid_argument, "unclosed {} quote", quote);
  if (in_word) words.push_back(std::move(cur));
  return words;
}

Result<std::unique_ptr<Repl>> Repl::create(json cfg, std::FILE* out) {
  std::unique_ptr<Repl> r(new Repl());
  r->out_ = out;
  driver::PpoTrainerOptions po;
  po.console = nullptr;
  po.progress = nullptr;
  TESSERA_ASSIGN_OR_RETURN(r->trainer_, driver::RayPPOTrainer::create(std::move(cfg), worker_types(), po));
  TESSERA_RETURN_IF_ERROR(r->trainer_->init_workers());
  return r;
}

Repl::~Repl() = default;

bool Repl::execute(const std::string& line) {
  Result<std::vector<std::string>> words = split_command_line(line);
  if (!words.ok()) {
    fmt::print(out_, "error: {}\n{}", words.status().message(), kHelp);
    std::fflush(out_);
    return true;
  }
  if (words->empty()) return true;
  const std::string& cmd = words->front();
  if (cmd == "quit" || cmd == "exit") return false;
  Status st;
  try {
    st = run(*words);
  } catch (const std::exception& e) {  // a bug below must not end the session
    st = make_error(ErrorCode::internal, "{}", e.what());
  }
  if (!st.ok()) fmt::print(out_, "error: {}\n", st.to_string());
  if (st.code() == ErrorCode::invalid_argument && st.message().rfind("unknown command", 0) == 0) {
    fmt::print(out_, "{}", kHelp);
  }
  std::fflush(out_);
  return true;
}

Status Repl::run(const std::vector<std::string>& w) {
  const std::string& cmd = w[0];
  using Handler = std::function<Status()>;
  const std::map<std::string, Handler> table = {
      {"help", [&] { fmt::print(out_, "{}", kHelp); return Status(); }},
      {"groups", [&] { return cmd_groups(); }},
      {"methods", [&] { return cmd_methods(w); }},
      {"call", [&] { return cmd_call(w); }},
      {"inspect", [&] { return cmd_inspect(w); }},
      {"generate", [&] { return cmd_generate(w); }},
      {"step", [&] { return cmd_steps(1); }},
      {"run", [&]() -> Status {
         if (w.size() != 2) return make_error(ErrorCode::invalid_argument, "usage: run N");
         TESSERA_ASSIGN_OR_RETURN(int64_t n, parse_count(w[1], "N"));
         return cmd_steps(n);
       }},
      {"validate", [&]() -> Status {
         TESSERA_ASSIGN_OR_RETURN(driver::Metrics m, trainer_->validate());
         print_metrics(out_, m, "");
         return Status();
       }},
      {"metrics", [&] { return cmd_metrics(w); }},
      {"save", [&]() -> Status {
         TESSERA_RETURN_IF_ERROR(trainer_->save_checkpoint());
         fmt::print(out_, "saved global_step_{}\n", trainer_->global_steps());
         return Status();
       }},
  };
  auto it = table.find(cmd);
  if (it == table.end()) return make_error(ErrorCode::invalid_argument, "unknown command '{}'", cmd);
  return it->second();
}

Result<dispatch::WorkerGroup*> Repl::group(const std::string& name) const {
  for (const auto& [n, g] : trainer_->worker_groups()) {
    if (n == name) return g;
  }
  std::string names;
  for (const auto& [n, g] : trainer_->worker_groups()) names += (names.empty() ? "" : ", ") + n;
  return make_error(ErrorCode::not_found, "no worker group '{}' (groups: {})", name, names);
}

Status Repl::cmd_groups() {
  const double rss = rss_gib();
  for (const auto& [name, g] : trainer_->worker_groups()) {
    fmt::print(out_, "{} ({} ranks)\n", name, g->world_size());
    for (const runtime::WorkerRef& w : g->workers()) {
      std::string mem = w.local ? fmt::format("driver process rss {:.2f} GiB", rss) : "on agent";
      fmt::print(out_, "  rank {:<3} {:<8} host {:<16} {}\n", w.context.rank, w.context.device, w.context.host,
                 mem);
    }
  }
  return Status();
}

Status Repl::cmd_methods(const std::vector<std::string>& w) {
  if (w.size() != 2) return make_error(ErrorCode::invalid_argument, "usage: methods GROUP");
  TESSERA_ASSIGN_OR_RETURN(dispatch::WorkerGroup * g, group(w[1]));
  for (const dispatch::MethodSpec& m : g->methods()) {
    if (m.name.rfind("__", 0) == 0) continue;
    fmt::print(out_, "  {:<28} {:<20} {}{}\n", m.name, m.dispatch_mode, dispatch::to_string(m.execute_mode),
               m.blocking ? "" : " (non-blocking)");
  }
  return Status();
}

Status Repl::cmd_call(const std::vector<std::string>& w) {
  if (w.size() < 3) return make_error(ErrorCode::invalid_argument, "usage: call GROUP METHOD [rows=N] [meta=JSON] [ARG_JSON...]");
  TESSERA_ASSIGN_OR_RETURN(dispatch::WorkerGroup * g, group(w[1]));
  Words words = parse_words(w, 3, {"rows", "meta"});
  dispatch::Args args;
  if (words.named.count("rows")) {
    TESSERA_ASSIGN_OR_RETURN(int64_t n, parse_count(words.named["rows"], "rows"));
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < n; ++i) idx.push_back((data_cursor_ + i) % trainer_->train_dataset().size());
    data_cursor_ = (data_cursor_ + n) % trainer_->train_dataset().size();
    TESSERA_ASSIGN_OR_RETURN(proto::DataProto batch, trainer_->train_dataset().collate(idx));
    if (words.named.count("meta")) {
      TESSERA_ASSIGN_OR_RETURN(json meta, parse_json_word(words.named["meta"], "meta"));
      if (!meta.is_object()) return make_error(ErrorCode::invalid_argument, "meta must be a JSON object");
      batch.meta_info().update(meta);
    }
    args.emplace_back(std::move(batch));
  }
  for (const std::string& a : words.positional) {
    TESSERA_ASSIGN_OR_RETURN(json j, parse_json_word(a, "argument"));
    args.emplace_back(std::move(j));
  }
  TESSERA_ASSIGN_OR_RETURN(dispatch::Value v, g->call(w[2], args));
  if (v.is_proto()) {
    last_ = v.proto();
    print_proto_summary(*last_);
  } else if (v.is_json()) {
    fmt::print(out_, "{}\n", v.json().dump(2));
  } else {
    fmt::print(out_, "{} values (one per rank)\n", v.list().size());
    for (size_t i = 0; i < v.list().size(); ++i) {
      const dispatch::Value& e = v.list()[i];
      fmt::print(out_, "  [{}] {}\n", i, e.is_json() ? e.json().dump() : (e.is_proto() ? "DataProto" : "list"));
    }
  }
  return Status();
}

void Repl::print_proto_summary(const proto::DataProto& p) {
  fmt::print(out_, "DataProto: {} rows\n", p.size());
  for (const auto& [k, t] : p.batch()) fmt::print(out_, "  {:<24} {:<10} {}\n", k, std::string(c10::toString(t.scalar_type())), shape_of(t));
  for (const auto& [k, c] : p.non_tensor_batch()) fmt::print(out_, "  {:<24} (non-tensor)\n", k);
  if (!p.meta_info().empty()) fmt::print(out_, "  meta_info: {}\n", p.meta_info().dump());
}

Status Repl::cmd_inspect(const std::vector<std::string>& w) {
  if (!last_) return make_error(ErrorCode::not_found, "nothing to inspect yet: run `call ...` or `generate ...` first");
  Words words = parse_words(w, 1, {"rows"});
  int64_t k = 2;
  if (words.named.count("rows")) {
    TESSERA_ASSIGN_OR_RETURN(k, parse_count(words.named["rows"], "rows"));
  }
  print_proto_summary(*last_);
  std::optional<int32_t> pad;  // the id the datasets pad with (the pad token, else EOS)
  if (Result<int32_t> p = driver::dataset_pad_id(trainer_->tokenizer()); p.ok()) pad = *p;
  for (const char* key : {"prompts", "responses", "input_ids"}) {
    Result<at::Tensor> t = last_->tensor(key);
    if (!t.ok() || t->dim() != 2) continue;
    for (int64_t r = 0; r < std::min<int64_t>(k, t->size(0)); ++r) {
      TESSERA_ASSIGN_OR_RETURN(std::string text, trainer_->tokenizer().decode(row_ids(*t, r, pad)));
      fmt::print(out_, "  {}[{}]: {}\n", key, r, json(text).dump());
    }
  }
  return Status();
}

Status Repl::cmd_generate(const std::vector<std::string>& w) {
  if (w.size() != 2) return make_error(ErrorCode::invalid_argument, "usage: generate \"PROMPT\"");
  TESSERA_ASSIGN_OR_RETURN(dispatch::WorkerGroup * g, group("actor_rollout"));
  TESSERA_ASSIGN_OR_RETURN(std::optional<std::string> custom,
                           driver::config_get_or<std::optional<std::string>>(
                               trainer_->config(), "actor_rollout_ref.model.custom_chat_template", std::nullopt));
  TESSERA_ASSIGN_OR_RETURN(tokenizer::ChatTemplate ct,
                           tokenizer::ChatTemplate::from_name(custom.value_or("auto"), trainer_->tokenizer().config()));
  TESSERA_ASSIGN_OR_RETURN(std::string text, ct.render({{"user", w[1]}}, /*add_generation_prompt=*/true));
  TESSERA_ASSIGN_OR_RETURN(std::vector<int32_t> ids, trainer_->tokenizer().encode(text));
  const int64_t n = g->world_size(), len = static_cast<int64_t>(ids.size());
  at::Tensor row = at::empty({1, len}, at::kLong);
  for (int64_t i = 0; i < len; ++i) row[0][i] = ids[static_cast<size_t>(i)];
  at::Tensor input_ids = row.repeat({n, 1});
  at::Tensor mask = at::ones({n, len}, at::kLong);
  at::Tensor pos = driver::compute_position_id_with_mask(mask);
  // The worker fills in eos_token_id / pad_token_id from the model's tokenizer.
  json meta = {{"do_sample", false}, {"validate", true}, {"recompute_log_prob", false}};
  // raw_prompt: the chat, which a multi-turn rollout renders itself (with its tools' schemas).
  proto::NonTensorBatch chat;
  chat.insert_or_assign("raw_prompt", proto::Column::jsons(std::vector<json>(
                                          static_cast<size_t>(n), json::array({{{"role", "user"}, {"content", w[1]}}}))));
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto in, proto::DataProto::from_dict(
      {{"input_ids", input_ids}, {"attention_mask", mask}, {"position_ids", pos}}, std::move(chat), meta));
  TESSERA_ASSIGN_OR_RETURN(dispatch::Value v, g->call("generate_sequences", {dispatch::Value(std::move(in))}));
  if (!v.is_proto()) return make_error(ErrorCode::internal, "generate_sequences returned no DataProto");
  last_ = v.proto();
  TESSERA_ASSIGN_OR_RETURN(at::Tensor responses, last_->tensor("responses"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor amask, last_->tensor("attention_mask"));
  std::vector<int32_t> out;
  const int64_t offset = amask.size(1) - responses.size(1);
  for (int64_t i = 0; i < responses.size(1); ++i) {
    if (amask[0][offset + i].item<int64_t>() == 0) break;
    out.push_back(static_cast<int32_t>(responses[0][i].item<int64_t>()));
  }
  TESSERA_ASSIGN_OR_RETURN(std::string reply, trainer_->tokenizer().decode(out));
  fmt::print(out_, "{}\n", reply);
  return Status();
}

Status Repl::cmd_steps(int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    TESSERA_ASSIGN_OR_RETURN(std::optional<driver::Metrics> m, trainer_->step());
    if (!m) {
      fmt::print(out_, "training finished at step {}\n", trainer_->global_steps());
      return Status();
    }
    last_metrics_ = *m;
    auto get = [&](const char* k) { auto it = m->find(k); return it == m->end() ? 0.0 : it->second; };
    fmt::print(out_, "step {}: critic/score/mean {:.4f}  actor/pg_loss {:.4f}  response_length/mean {:.1f}  timing_s/step {:.2f}\n",
               trainer_->global_steps(), get("critic/score/mean"), get("actor/pg_loss"), get("response_length/mean"),
               get("timing_s/step"));
  }
  return Status();
}

Status Repl::cmd_metrics(const std::vector<std::string>& w) {
  if (last_metrics_.empty()) return make_error(ErrorCode::not_found, "no step has run yet: `step` or `run N`");
  print_metrics(out_, last_metrics_, w.size() > 1 ? w[1] : "");
  return Status();
}

std::vector<std::string> Repl::complete(const std::vector<std::string>& before, const std::string& word) const {
  std::vector<std::string> pool;
  if (before.empty()) {
    pool = {"help", "groups", "methods", "call", "inspect", "generate", "step", "run", "validate", "metrics", "save", "quit"};
  } else if ((before[0] == "call" || before[0] == "methods") && before.size() == 1) {
    for (const auto& [n, g] : trainer_->worker_groups()) pool.push_back(n);
  } else if (before[0] == "call" && before.size() == 2) {
    for (const auto& [n, g] : trainer_->worker_groups()) {
      if (n != before[1]) continue;
      for (const dispatch::MethodSpec& m : g->methods()) pool.push_back(m.name);
    }
  }
  std::vector<std::string> out;
  for (const std::string& p : pool) {
    if (p.compare(0, word.size(), word) == 0) out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace tessera::app
