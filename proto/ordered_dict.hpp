// ordered_dict.hpp: an insertion-ordered string-keyed map, the C++ stand-in for Python's dict.
//
// DataProto's `batch` and `non_tensor_batch` keep their keys in insertion order, like verl's
// TensorDict and Python dicts, because dispatch, codec and printing iterate them in that order.
// Lookups are linear: a DataProto holds a handful of keys, for which a vector beats any hash map.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace tessera::proto {

/// Insertion-ordered map from std::string to V. Not thread-safe; value semantics.
template <class V>
class OrderedDict {
 public:
  using value_type = std::pair<std::string, V>;
  using iterator = typename std::vector<value_type>::iterator;
  using const_iterator = typename std::vector<value_type>::const_iterator;

  OrderedDict() = default;
  /// Builds from (key, value) pairs; a repeated key keeps its first position and last value.
  OrderedDict(std::initializer_list<value_type> items) {
    for (const auto& kv : items) insert_or_assign(kv.first, kv.second);
  }

  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  bool contains(const std::string& key) const { return find(key) != nullptr; }

  /// The value for `key`, or nullptr when absent. The pointer is invalidated by any mutation.
  const V* find(const std::string& key) const {
    auto it = locate(key);
    return it == items_.end() ? nullptr : &it->second;
  }
  V* find(const std::string& key) {
    auto it = std::find_if(items_.begin(), items_.end(),
                           [&](const value_type& kv) { return kv.first == key; });
    return it == items_.end() ? nullptr : &it->second;
  }

  /// Inserts at the end, or replaces the value in place (keeping the key's position).
  void insert_or_assign(const std::string& key, V value) {
    if (V* v = find(key)) {
      *v = std::move(value);
    } else {
      items_.emplace_back(key, std::move(value));
    }
  }

  /// Removes `key`; returns false when it was absent.
  bool erase(const std::string& key) {
    auto it = std::find_if(items_.begin(), items_.end(),
                           [&](const value_type& kv) { return kv.first == key; });
    if (it == items_.end()) return false;
    items_.erase(it);
    return true;
  }

  /// Renames `from` to `to` in place. REQUIRES: contains(from) && !contains(to).
  void rename_key(const std::string& from, const std::string& to) {
    for (auto& kv : items_) {
      if (kv.first == from) kv.first = to;
    }
  }

  /// Keys in insertion order.
  std::vector<std::string> keys() const {
    std::vector<std::string> out;
    out.reserve(items_.size());
    for (const auto& kv : items_) out.push_back(kv.first);
    return out;
  }

  void clear() { items_.clear(); }
  iterator begin() { return items_.begin(); }
  iterator end() { return items_.end(); }
  const_iterator begin() const { return items_.begin(); }
  const_iterator end() const { return items_.end(); }

 private:
  const_iterator locate(const std::string& key) const {
    return std::find_if(items_.begin(), items_.end(),
                        [&](const value_type& kv) { return kv.first == key; });
  }

  std::vector<value_type> items_;
};

}  // namespace tessera::proto
