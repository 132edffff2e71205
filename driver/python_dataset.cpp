// python_dataset.cpp: see python_dataset.hpp.
#include "driver/python_dataset.hpp"

#include <chrono>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "driver/config.hpp"
#include "runtime/python_child.hpp"

namespace tessera::driver {
namespace {

using nlohmann::json;
using runtime::Clock;

constexpr const char* kKey = "data.custom_cls";

// The child: verl's create_rl_dataset, then every item as JSON, a chunk of rows per line.
constexpr const char* kDatasetScript = R"PY(
import math
spec = json.loads(requests.readline())

def plain(o):  # the items' numpy / torch values as JSON, in this process
    if hasattr(o, "tolist"):
        return o.tolist()
    return o.item() if hasattr(o, "item") else str(o)

def finite(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [finite(v) for v in o]
    return o

def send(message):
    proto.write(json.dumps(finite(json.loads(json.dumps(message, default=plain))), allow_nan=False) + "\n")
    proto.flush()

try:
    from omegaconf import OmegaConf
    from torch.utils.data import Dataset
    from verl.utils import hf_tokenizer
    from verl.utils.import_utils import load_extern_type
    from verl.utils.fs import copy_to_local
    cls = load_extern_type(spec["path"], spec["name"])
    if cls is None or (not spec["sft"] and not (isinstance(cls, type) and issubclass(cls, Dataset))):
        raise TypeError(f"the custom dataset class '{spec['name']}' from '{spec['path']}' must inherit from "
                        "torch.utils.data.Dataset")
    tokenizer = hf_tokenizer(copy_to_local(spec["tokenizer"]), trust_remote_code=spec["trust_remote_code"])
    config = OmegaConf.create(spec["config"])
    files = OmegaConf.create(spec["files"])  # a ListConfig, as verl passes data.train_files
    if spec["sft"]:  # verl's create_sft_dataset
        dataset = cls(parquet_files=files, tokenizer=tokenizer, config=config)
    else:  # verl's create_rl_dataset
        dataset = cls(data_files=files, tokenizer=tokenizer, processor=None, config=config)
    size = len(dataset)
except BaseException as e:
    send({"fatal": f"{type(e).__name__}: {e}"})
    sys.exit(1)
send({"ready": True, "size": size})

READ = {"input_ids", "attention_mask", "position_ids", "raw_prompt_ids", "raw_prompt", "full_prompts", "data_source",
        "ability", "reward_model", "extra_info", "index", "tools_kwargs", "interaction_kwargs", "agent_name"}
unread, rows = set(), []
for i in range(size):
    try:
        item = dataset[i]
        if not isinstance(item, dict):
            raise TypeError(f"the item is a {type(item).__name__}, not a dict")
        if item.get("multi_modal_data") or item.get("multi_modal_inputs"):
            raise ValueError("the item has multi_modal_data; Tessera's models are text-only")
        if spec["sft"]:
            row = {k: [int(t) for t in (lambda v: v.tolist() if hasattr(v, "tolist") else v)(item[k])]
                   for k in ("input_ids", "attention_mask", "position_ids", "loss_mask")}
            rows.append(row)
            if len(rows) == 256 or i == size - 1:
                send({"rows": rows})
                rows = []
            continue
        ids, mask = (list(v.tolist() if hasattr(v, "tolist") else v) for v in (item["input_ids"], item["attention_mask"]))
        if len(ids) != len(mask):
            raise ValueError(f"input_ids has {len(ids)} tokens and attention_mask {len(mask)}")
        row = {"prompt_ids": [int(t) for t, m in zip(ids, mask) if m]}
        for key in ("data_source", "ability", "reward_model", "extra_info", "raw_prompt", "agent_name"):
            row[key] = item.get(key)
        unread.update(k for k in item if k not in READ)
    except Exception as e:
        row = {"error": f"{type(e).__name__}: {e}"}
    rows.append(row)
    if len(rows) == 256 or i == size - 1:
        send({"rows": rows})
        rows = []
send({"done": True, "unread": sorted(unread)})
)PY";

// One item as a row; errors name it.
Result<RLHFRow> to_row(const json& item, const std::string& where, int64_t max_prompt_length) {
  if (item.contains("error")) return make_error(ErrorCode::corrupt_data, "{}: {}", where, item["error"].get<std::string>());
  RLHFRow r;
  r.source = where;
  const json& source = item.value("data_source", json());
  if (!source.is_string()) {
    return make_error(ErrorCode::corrupt_data, "{}: 'data_source' must be a string, got {}", where, source.dump());
  }
  r.data_source = source.get<std::string>();
  const json& ability = item.value("ability", json());
  r.ability = ability.is_string() ? ability.get<std::string>() : std::string();
  r.reward_model = item.value("reward_model", json());
  if (!r.reward_model.is_object()) {
    return make_error(ErrorCode::corrupt_data, "{}: 'reward_model' must be a mapping with 'ground_truth', got {}", where,
                      r.reward_model.dump().substr(0, 80));
  }
  r.extra_info = item.value("extra_info", json());
  r.prompt = item.value("raw_prompt", json());
  const json& agent = item.value("agent_name", json());
  if (!agent.is_null() && !agent.is_string()) {
    return make_error(ErrorCode::corrupt_data, "{}: 'agent_name' must be a string, got {}", where, agent.dump());
  }
  if (agent.is_string()) r.agent_name = agent.get<std::string>();
  for (const auto& t : item.value("prompt_ids", json::array())) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) {
      return make_error(ErrorCode::corrupt_data, "{}: input_ids holds {}, not a token id", where, t.dump());
    }
    r.prompt_ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  if (r.prompt_ids.empty() || static_cast<int64_t>(r.prompt_ids.size()) > max_prompt_length) {
    return make_error(ErrorCode::corrupt_data, "{}: the prompt has {} tokens under attention_mask; "
                      "data.max_prompt_length is {}", where, r.prompt_ids.size(), max_prompt_length);
  }
  return r;
}

}  // namespace

Result<PythonDatasetOptions> PythonDatasetOptions::from_config(const json& cfg) {
  PythonDatasetOptions o;
  TESSERA_ASSIGN_OR_RETURN(o.path, config_get<std::string>(cfg, "data.custom_cls.path"));
  TESSERA_ASSIGN_OR_RETURN(auto name, config_get<std::optional<std::string>>(cfg, "data.custom_cls.name"));
  if (!name || name->empty()) {
    return make_error(ErrorCode::invalid_argument, "data.custom_cls.name: the class to load from data.custom_cls.path={} "
                      "is not set", o.path);
  }
  o.name = *name;
  o.data_config = cfg.at("data");
  o.data_config["return_raw_chat"] = true;  // Tessera's batches always carry raw_prompt
  TESSERA_ASSIGN_OR_RETURN(auto tokenizer, config_get<std::optional<std::string>>(cfg, "data.tokenizer"));
  TESSERA_ASSIGN_OR_RETURN(std::string model, config_get<std::string>(cfg, "actor_rollout_ref.model.path"));
  o.tokenizer_path = tokenizer.value_or(model);
  TESSERA_ASSIGN_OR_RETURN(o.trust_remote_code, config_get_or<bool>(cfg, "data.trust_remote_code", false));
  return o;
}

Result<PythonDatasetOptions> PythonDatasetOptions::from_sft_config(const json& cfg) {
  PythonDatasetOptions o;
  o.sft = true;
  TESSERA_ASSIGN_OR_RETURN(o.path, config_get<std::string>(cfg, "data.custom_cls.path"));
  TESSERA_ASSIGN_OR_RETURN(auto name, config_get<std::optional<std::string>>(cfg, "data.custom_cls.name"));
  if (!name || name->empty()) {
    return make_error(ErrorCode::invalid_argument, "data.custom_cls.name: the class to load from data.custom_cls.path={} "
                      "is not set", o.path);
  }
  o.name = *name;
  o.data_config = cfg.at("data");
  TESSERA_ASSIGN_OR_RETURN(o.tokenizer_path, config_get<std::string>(cfg, "model.partial_pretrain"));
  TESSERA_ASSIGN_OR_RETURN(o.trust_remote_code, config_get_or<bool>(cfg, "model.trust_remote_code", false));
  return o;
}

namespace {

// Every item of the class over `files`, as the child converted it (RL rows or SFT columns).
Result<std::vector<json>> read_items(const std::vector<std::filesystem::path>& files, const PythonDatasetOptions& options,
                                     const std::string& what) {
  const std::string python = options.python.empty() ? runtime::python_from_env("TESSERA_DATA_PYTHON") : options.python;
  TESSERA_ASSIGN_OR_RETURN(runtime::PythonChild child, runtime::spawn_python(python, kDatasetScript, {}, kKey));
  struct Reap {
    runtime::PythonChild& child;
    ~Reap() { runtime::kill_child(child); }
  } reap{child};
  json spec = {{"path", options.path},
               {"name", options.name},
               {"sft", options.sft},
               {"tokenizer", options.tokenizer_path},
               {"trust_remote_code", options.trust_remote_code},
               {"config", options.data_config},
               {"files", json::array()}};
  for (const auto& f : files) spec["files"].push_back(f.string());
  // A class may read and tokenize its whole dataset when built, an item at a time afterwards.
  constexpr auto kPatience = std::chrono::minutes(30);
  TESSERA_RETURN_IF_ERROR(runtime::write_all(child, spec.dump(-1, ' ', false, json::error_handler_t::replace) + "\n",
                                             Clock::now() + kPatience));
  auto next = [&]() -> Result<json> {
    Result<std::string> line = runtime::read_line(child, Clock::now() + kPatience);
    if (!line.ok()) return make_error(line.status().code(), "{}: the dataset process: {}", what, line.status().message());
    json message = json::parse(*line, nullptr, false);
    if (!message.is_object()) {
      return make_error(ErrorCode::internal, "{}: the dataset process wrote '{}'", what,
                        runtime::first_line(*line).substr(0, 120));
    }
    if (message.contains("fatal")) {
      return make_error(ErrorCode::invalid_argument, "{}: {}", what, message["fatal"].get<std::string>());
    }
    return message;
  };
  TESSERA_ASSIGN_OR_RETURN(json ready, next());
  const int64_t size = ready.value("size", json()).is_number_integer() ? ready["size"].get<int64_t>() : -1;
  if (size < 0) return make_error(ErrorCode::internal, "{}: the dataset process gave no size", what);
  std::vector<json> items;
  items.reserve(static_cast<size_t>(size));
  while (static_cast<int64_t>(items.size()) < size) {
    TESSERA_ASSIGN_OR_RETURN(json chunk, next());
    if (!chunk.contains("rows") || !chunk["rows"].is_array() || chunk["rows"].empty()) {
      return make_error(ErrorCode::internal, "{}: the dataset process sent no rows", what);
    }
    for (json& item : chunk["rows"]) items.push_back(std::move(item));
  }
  TESSERA_ASSIGN_OR_RETURN(json done, next());
  if (const json& unread = done.value("unread", json::array()); !unread.empty()) {
    spdlog::info("{}: item keys no step reads: {}", what, unread.dump());
  }
  return items;
}

std::string describe(const PythonDatasetOptions& options) {
  return fmt::format("{} ({} from {})", kKey, options.name, options.path);
}

// An SFT item: four columns of exactly `max_length` integers (mask columns 0 or 1).
Result<SFTExample> to_example(const json& item, const std::string& where, int64_t max_length) {
  if (item.contains("error")) return make_error(ErrorCode::corrupt_data, "{}: {}", where, item["error"].get<std::string>());
  SFTExample ex;
  ex.source = where;
  for (auto [key, column] : {std::pair{"input_ids", &ex.item_ids}, std::pair{"attention_mask", &ex.item_mask},
                             std::pair{"position_ids", &ex.item_positions}, std::pair{"loss_mask", &ex.item_loss}}) {
    const json& values = item.value(key, json());
    if (!values.is_array() || static_cast<int64_t>(values.size()) != max_length) {
      return make_error(ErrorCode::corrupt_data, "{}: {} has {} values; data.max_length is {}", where, key,
                        values.is_array() ? values.size() : 0, max_length);
    }
    for (const auto& v : values) {
      const bool mask = std::string(key) == "attention_mask" || std::string(key) == "loss_mask";
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || (mask && v.get<int64_t>() > 1) ||
          v.get<int64_t>() > INT32_MAX) {
        return make_error(ErrorCode::corrupt_data, "{}: {} holds {}", where, key, v.dump());
      }
      column->push_back(v.get<int64_t>());
    }
  }
  return ex;
}

}  // namespace

Result<std::vector<RLHFRow>> read_python_dataset(const std::vector<std::filesystem::path>& files,
                                                 const PythonDatasetOptions& options, int64_t max_prompt_length) {
  const std::string what = describe(options);
  TESSERA_ASSIGN_OR_RETURN(std::vector<json> items, read_items(files, options, what));
  std::vector<RLHFRow> rows;
  rows.reserve(items.size());
  for (const json& item : items) {
    TESSERA_ASSIGN_OR_RETURN(RLHFRow row, to_row(item, fmt::format("{}: item {}", what, rows.size()), max_prompt_length));
    rows.push_back(std::move(row));
  }
  return rows;
}

Result<std::vector<SFTExample>> read_python_sft_dataset(const std::vector<std::filesystem::path>& files,
                                                        const PythonDatasetOptions& options, int64_t max_length) {
  const std::string what = describe(options);
  TESSERA_ASSIGN_OR_RETURN(std::vector<json> items, read_items(files, options, what));
  std::vector<SFTExample> examples;
  examples.reserve(items.size());
  for (const json& item : items) {
    TESSERA_ASSIGN_OR_RETURN(SFTExample ex, to_example(item, fmt::format("{}: item {}", what, examples.size()), max_length));
    examples.push_back(std::move(ex));
  }
  return examples;
}

}  // namespace tessera::driver
