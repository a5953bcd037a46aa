// PrefixStore: a namespace inside another store, so that several groups
// (or several rendezvous rounds) can share one server without key clashes.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kolo/store.h"

namespace kolo {
namespace {

class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base)
      : prefix_(std::move(prefix)), base_(std::move(base)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    return base_->Set(Full(key), value);
  }

  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override {
    return base_->Get(Full(key), timeout);
  }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    return base_->Add(Full(key), delta);
  }

  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const std::string& key : keys) full.push_back(Full(key));
    return base_->Wait(full, timeout);
  }

  absl::StatusOr<bool> Check(const std::string& key) override {
    return base_->Check(Full(key));
  }

 private:
  std::string Full(const std::string& key) const {
    return absl::StrCat(prefix_, "/", key);
  }

  const std::string prefix_;
  const std::shared_ptr<Store> base_;
};

}  // namespace

std::shared_ptr<Store> NewPrefixStore(std::string prefix,
                                      std::shared_ptr<Store> base) {
  return std::make_shared<PrefixStore>(std::move(prefix), std::move(base));
}

}  // namespace kolo
