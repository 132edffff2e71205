// tokenizer_bpe.cpp: BPE vocab/merges parsing, HF's merge_all, and the LRU word cache.
#include "workers/tokenizer/tokenizer_bpe.hpp"

#include <list>
#include <mutex>
#include <queue>

#include "workers/tokenizer/unicode.hpp"

namespace tessera::tokenizer {

using tokenizer_json::JsonPath;
using tokenizer_json::field_error;
using tokenizer_json::unsupported_error;

namespace {

// Ids above this are refused: the id -> token table is a dense vector.
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// A possible merge of the symbol at `pos` with its right neighbour. The queue pops the lowest
// rank first and, among equal ranks, the leftmost (HF's `Merge` ordering).
struct MergeCandidate {
  int32_t rank;
  int pos;
  int32_t new_id;
  bool operator>(const MergeCandidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

// "U+00E9" for a character, "byte 0xFF" for an ill-formed byte.
std::string describe_char(std::string_view c) {
  const unicode::Utf8Char d = unicode::decode_utf8(c, 0);
  if (!d.valid) return fmt::format("byte 0x{:02X}", static_cast<uint8_t>(c[0]));
  return fmt::format("U+{:04X}", d.cp);
}

}  // namespace

/// Least-recently-used map from word to ids, guarded by a mutex.
class BpeWordCache {
 public:
  explicit BpeWordCache(size_t capacity) : capacity_(capacity) {}

  bool get(const std::string& word, std::vector<int32_t>& out) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(word);
    if (it == index_.end()) return false;
    order_.splice(order_.begin(), order_, it->second);
    out.insert(out.end(), it->second->second.begin(), it->second->second.end());
    return true;
  }

  void put(const std::string& word, std::vector<int32_t> ids) {
    std::lock_guard<std::mutex> lock(mu_);
    if (capacity_ == 0 || index_.count(word) != 0) return;
    order_.emplace_front(word, std::move(ids));
    index_.emplace(word, order_.begin());
    if (order_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
  }

 private:
  using Entry = std::pair<std::string, std::vector<int32_t>>;
  std::mutex mu_;
  size_t capacity_;
  std::list<Entry> order_;
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

BpeModel::BpeModel() : cache_(std::make_unique<BpeWordCache>(kDefaultCacheCapacity)) {}
BpeModel::BpeModel(BpeModel&&) noexcept = default;
BpeModel& BpeModel::operator=(BpeModel&&) noexcept = default;
BpeModel::~BpeModel() = default;

namespace {

Status parse_vocab(const nlohmann::json& vocab, const JsonPath& where,
                   std::unordered_map<std::string, int32_t>& out, std::vector<std::string>& by_id,
                   std::vector<bool>& has_id) {
  if (!vocab.is_object()) return field_error(where, "expected an object of token -> id");
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxTokenId) {
      return field_error(where / token, "expected an id in [0, 2^24)");
    }
    max_id = std::max(max_id, id.get<int64_t>());
  }
  by_id.assign(static_cast<size_t>(max_id + 1), std::string());
  has_id.assign(static_cast<size_t>(max_id + 1), false);
  out.reserve(vocab.size());
  for (const auto& [token, id_json] : vocab.items()) {
    const auto id = id_json.get<int32_t>();
    if (has_id[id]) {
      return field_error(where, fmt::format("id {} is used by both '{}' and '{}'", id, by_id[id], token));
    }
    has_id[id] = true;
    by_id[id] = token;
    out.emplace(token, id);
  }
  return Status();
}

// One merges entry: "a b" or ["a", "b"].
Result<std::pair<std::string, std::string>> parse_merge(const nlohmann::json& m, const JsonPath& p) {
  if (m.is_string()) {
    const auto& s = m.get_ref<const std::string&>();
    const size_t space = s.find(' ');
    if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
      return field_error(p, fmt::format("merge \"{}\" is not two tokens separated by one space", s));
    }
    return std::make_pair(s.substr(0, space), s.substr(space + 1));
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    return std::make_pair(m[0].get<std::string>(), m[1].get<std::string>());
  }
  return field_error(p, "expected a merge as \"a b\" or [\"a\", \"b\"]");
}

Status check_supported_options(const nlohmann::json& model, const JsonPath& where) {
  // HF samples merges when dropout is set; 0.0 means none there too (BPE::tokenize).
  if (const auto* d = tokenizer_json::optional_member(model, "dropout")) {
    if (!d->is_number() || d->get<double>() != 0.0) {
      return unsupported_error(where / "dropout", "BPE dropout is not supported (must be null)");
    }
  }
  if (const auto* t = tokenizer_json::optional_member(model, "type")) {
    if (!t->is_string() || t->get<std::string>() != "BPE") {
      return unsupported_error(where / "type", fmt::format("model type {} is not supported (only BPE)", t->dump()));
    }
  }
  return Status();
}

}  // namespace

Status BpeModel::add_merge(const std::string& a, const std::string& b, int32_t rank, const JsonPath& where) {
  auto ia = vocab_.find(a), ib = vocab_.find(b);
  if (ia == vocab_.end()) return field_error(where, fmt::format("token '{}' is not in model.vocab", a));
  if (ib == vocab_.end()) return field_error(where, fmt::format("token '{}' is not in model.vocab", b));
  std::string_view tail = b;
  if (!continuing_subword_prefix_.empty() && tail.substr(0, continuing_subword_prefix_.size()) == continuing_subword_prefix_) {
    tail.remove_prefix(continuing_subword_prefix_.size());
  }
  const std::string merged = a + std::string(tail);
  auto im = vocab_.find(merged);
  if (im == vocab_.end()) return field_error(where, fmt::format("merged token '{}' is not in model.vocab", merged));
  merges_[pair_key(ia->second, ib->second)] = Merge{rank, im->second};  // later duplicates win, as in HF
  return Status();
}

Result<BpeModel> BpeModel::from_json(const nlohmann::json& model, const JsonPath& where) {
  TESSERA_RETURN_IF_ERROR(check_supported_options(model, where));
  BpeModel bpe;
  bpe.source_ = where.file;
  TESSERA_ASSIGN_OR_RETURN(const nlohmann::json* vocab, tokenizer_json::member(model, where, "vocab"));
  TESSERA_RETURN_IF_ERROR(parse_vocab(*vocab, where / "vocab", bpe.vocab_, bpe.id_to_token_, bpe.has_id_));
  TESSERA_ASSIGN_OR_RETURN(auto prefix, tokenizer_json::optional_string_member(model, where, "continuing_subword_prefix"));
  TESSERA_ASSIGN_OR_RETURN(auto suffix, tokenizer_json::optional_string_member(model, where, "end_of_word_suffix"));
  TESSERA_ASSIGN_OR_RETURN(auto unk, tokenizer_json::optional_string_member(model, where, "unk_token"));
  TESSERA_ASSIGN_OR_RETURN(bpe.fuse_unk_, tokenizer_json::bool_member(model, where, "fuse_unk", false));
  TESSERA_ASSIGN_OR_RETURN(bpe.ignore_merges_, tokenizer_json::bool_member(model, where, "ignore_merges", false));
  TESSERA_ASSIGN_OR_RETURN(bool byte_fallback, tokenizer_json::bool_member(model, where, "byte_fallback", false));
  if (byte_fallback) bpe.index_byte_tokens();
  bpe.continuing_subword_prefix_ = prefix.value_or("");
  bpe.end_of_word_suffix_ = suffix.value_or("");
  if (unk) {
    auto it = bpe.vocab_.find(*unk);
    if (it == bpe.vocab_.end()) return field_error(where / "unk_token", fmt::format("'{}' is not in model.vocab", *unk));
    bpe.unk_id_ = it->second;
    bpe.unk_token_ = *unk;
  }
  TESSERA_ASSIGN_OR_RETURN(const nlohmann::json* merges, tokenizer_json::member(model, where, "merges"));
  if (!merges->is_array()) return field_error(where / "merges", "expected an array");
  bpe.merges_.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const JsonPath p = (where / "merges").at(i);
    TESSERA_ASSIGN_OR_RETURN(auto parts, parse_merge((*merges)[i], p));
    TESSERA_RETURN_IF_ERROR(bpe.add_merge(parts.first, parts.second, static_cast<int32_t>(i), p));
  }
  return bpe;
}

void BpeModel::index_byte_tokens() {
  byte_ids_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(fmt::format("<0x{:02X}>", b));  // Rust's format!("<{b:#04X}>")
    if (it != vocab_.end()) byte_ids_[b] = it->second;
  }
}

bool BpeModel::append_byte_tokens(std::string_view key, std::vector<int32_t>& symbols) const {
  if (byte_ids_.empty()) return false;
  for (char c : key) {
    if (byte_ids_[static_cast<uint8_t>(c)] < 0) return false;
  }
  for (char c : key) symbols.push_back(byte_ids_[static_cast<uint8_t>(c)]);
  return true;
}

// HF BPE::merge_word. Note that a byte-fallback character does not flush a pending unk: HF adds
// the byte tokens first and the unk when the next known character (or the word's end) comes.
Status BpeModel::build_word(std::string_view word, std::vector<int32_t>& symbols) const {
  std::optional<int32_t> pending_unk;  // an unk not yet emitted (fuse_unk joins runs of them)
  std::string key;
  for (size_t pos = 0; pos < word.size();) {
    const uint32_t len = unicode::decode_utf8(word, pos).len;
    key.clear();
    if (pos != 0) key += continuing_subword_prefix_;
    key.append(word.substr(pos, len));
    if (pos + len == word.size()) key += end_of_word_suffix_;
    auto it = vocab_.find(key);
    if (it != vocab_.end()) {
      if (pending_unk) symbols.push_back(*pending_unk);
      pending_unk.reset();
      symbols.push_back(it->second);
    } else if (append_byte_tokens(key, symbols)) {
      // byte_fallback: one <0xXX> token per byte of the (prefixed) character
    } else if (unk_id_) {
      if (pending_unk && !fuse_unk_) symbols.push_back(*pending_unk);
      pending_unk = unk_id_;
    } else {
      return make_error(ErrorCode::invalid_argument,
                        "{}: {} is not in the vocabulary and model.unk_token is not set",
                        source_, describe_char(word.substr(pos, len)));
    }
    pos += len;
  }
  if (pending_unk) symbols.push_back(*pending_unk);
  return Status();
}

void BpeModel::merge_all(std::vector<int32_t>& symbols) const {
  if (symbols.size() < 2 || merges_.empty()) return;
  const int n = static_cast<int>(symbols.size());
  std::vector<int> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  std::priority_queue<MergeCandidate, std::vector<MergeCandidate>, std::greater<MergeCandidate>> queue;
  auto push_pair = [&](int left) {
    if (left < 0 || next[left] < 0) return;
    auto it = merges_.find(pair_key(symbols[left], symbols[next[left]]));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.new_id});
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i);
  while (!queue.empty()) {
    const MergeCandidate top = queue.top();
    queue.pop();
    if (!alive[top.pos] || next[top.pos] < 0) continue;
    const int right = next[top.pos];
    auto it = merges_.find(pair_key(symbols[top.pos], symbols[right]));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;  // stale entry
    symbols[top.pos] = top.new_id;
    alive[right] = false;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    push_pair(prev[top.pos]);
    push_pair(top.pos);
  }
  size_t out = 0;
  for (int i = 0; i < n; ++i) {
    if (alive[i]) symbols[out++] = symbols[i];
  }
  symbols.resize(out);
}

Status BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return Status();
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  std::string key;
  if (cacheable) {
    key.assign(word);
    if (cache_->get(key, out)) return Status();
  }
  std::vector<int32_t> symbols;
  auto whole = ignore_merges_ ? vocab_.find(std::string(word)) : vocab_.end();
  if (whole != vocab_.end()) {
    symbols.push_back(whole->second);
  } else {
    TESSERA_RETURN_IF_ERROR(build_word(word, symbols));
    merge_all(symbols);
  }
  out.insert(out.end(), symbols.begin(), symbols.end());
  if (cacheable) cache_->put(key, std::move(symbols));
  return Status();
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

}  // namespace tessera::tokenizer
