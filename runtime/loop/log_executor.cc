// LogExecutor (log_executor.h): what a rank does with each entry of its
// log.
#include "runtime/loop/log_executor.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/api/work_state.h"
#include "runtime/loop/phase_clock.h"
#include "runtime/negotiation/fusion.h"
#include "runtime/negotiation/response_cache.h"

namespace kolo {

LogExecutor::LogExecutor(
    const Options& options, ProcessSets* sets, TensorQueue* queue,
    const JobState* job, std::function<void(const absl::Status&)> fatal,
    std::function<absl::Status(const absl::Status&)> explain)
    : options_(options),
      sets_(sets),
      queue_(queue),
      job_(job),
      fatal_(std::move(fatal)),
      explain_(std::move(explain)) {}

absl::Status LogExecutor::RemoveSet(int id) {
  absl::StatusOr<std::shared_ptr<ProcessSetState>> set = sets_->Remove(id);
  if (!set.ok()) return set.status();
  queue_->FailSet(
      id, absl::AbortedError(absl::StrCat("process set ", id, " was removed")));
  if ((*set)->backend) (*set)->backend->Close();
  return absl::OkStatus();
}

void LogExecutor::ExecuteList(ProcessSetState& set,
                              const wire::ResponseList& list, bool made_here) {
  if (list.shutdown() && control_) control_->MarkShuttingDown();
  ++counters_.response_lists_received;
  // The coordinator applied the cache changes when it built the list.
  const bool apply_cache = !made_here && !list.cache_frozen();
  for (const wire::Response& response : list.responses()) {
    ExecuteResponse(set, response, apply_cache);
    if (job_->failed()) return;
  }
  set.executed_seq = list.seq();
  // Only the coordinator reads evicted entries.
  if (!made_here) set.cache->PruneGraveyard(list.seq());
}

namespace {

// Note [Caller turns]: what a caller may execute; the rest is the
// thread's (CUDA work runs on its streams; sets and joins change what
// the thread's passes read).
bool CallerMayRunResponse(const wire::Response& response) {
  switch (response.type()) {
    case wire::RESPONSE_JOIN:
    case wire::RESPONSE_ADD_PROCESS_SET:
    case wire::RESPONSE_REMOVE_PROCESS_SET:
      return false;
    default:
      return response.device_type() != static_cast<int>(DeviceType::kCuda);
  }
}

}  // namespace

bool LogExecutor::ExecuteIds(const HitBoardShared::Record& record,
                             int64_t fusion_threshold_bytes, bool caller) {
  ProcessSetState& global = sets_->global();
  // Every rank plans the same fusion: the same ids, the same cache (Note
  // [Hits on the board]), the coordinator's threshold.
  PhaseClock clock(options_.phase_times);
  singles_.clear();
  for (uint32_t i = 0; i < record.count; ++i) {
    const wire::Response* cached = global.cache->CachedResponse(record.ids[i]);
    if (!cached) {
      Fatal(absl::InternalError(absl::StrCat(
          "rank ", options_.rank, ": hit board names cache id ", record.ids[i],
          ", which this rank's response cache does not hold")));
      return true;
    }
    if (caller && !CallerMayRunResponse(*cached)) return false;
    singles_.push_back(cached);
  }
  ++counters_.board_records_executed;
  const std::vector<std::vector<size_t>> buckets =
      PlanBuckets(singles_, fusion_threshold_bytes, global.size());
  if (clock.on()) counters_.prepare_ns += clock.Lap();
  for (const std::vector<size_t>& bucket : buckets) {
    bucket_response_.Clear();
    bucket_.clear();
    for (size_t i : bucket) {
      bucket_response_.add_cache_ids(record.ids[i]);
      bucket_.push_back(singles_[i]);
    }
    // Touched in every rank's cache here, rank 0's (the coordinator's)
    // included (Note [Hits on the board]); the responses looked up above
    // stay (touching an id keeps its entry).
    ExecuteResponse(global, bucket_response_, /*apply_cache=*/true,
                    bucket_.data());
    if (job_->failed()) return true;
  }
  return true;
}

bool LogExecutor::CallerMayRun(const wire::ResponseList& list) {
  if (list.shutdown()) return false;
  std::shared_ptr<ProcessSetState> set = sets_->Find(list.process_set());
  if (!set) return false;
  for (const wire::Response& response : list.responses()) {
    if (response.cache_ids_size() == 0) {
      if (!CallerMayRunResponse(response)) return false;
      continue;
    }
    for (int64_t id : response.cache_ids()) {
      const wire::Response* cached = set->cache->CachedResponse(id);
      if (!cached || !CallerMayRunResponse(*cached)) return false;
    }
  }
  return true;
}

bool LogExecutor::IsMember(int process_set) {
  std::shared_ptr<ProcessSetState> set = sets_->Find(process_set);
  return set && set->member();
}

void LogExecutor::ExecuteList(int process_set, const wire::ResponseList& list) {
  std::shared_ptr<ProcessSetState> set = sets_->Find(process_set);
  if (!set || !set->member()) {
    Fatal(absl::InternalError(absl::StrCat(
        "rank ", options_.rank, " received response list ", list.seq(),
        " of process set ", process_set, ", which it is not a member of")));
    return;
  }
  ExecuteList(*set, list, /*made_here=*/false);
}

void LogExecutor::ExecuteResponse(ProcessSetState& set,
                                  const wire::Response& compact,
                                  bool apply_cache,
                                  const wire::Response* const* cached) {
  PhaseClock clock(options_.phase_times);
  // A response that came as cache ids is rebuilt from this rank's cache,
  // into storage kept from one response to the next.
  const bool from_cache = compact.cache_ids_size() > 0;
  const wire::Response& response = from_cache ? expanded_ : compact;
  if (from_cache && cached) {
    ExpandCachedResponse(cached, compact, &expanded_);
  } else if (from_cache &&
             !ExpandCachedResponse(*set.cache, compact, &expanded_)) {
    Fatal(absl::InternalError(
        absl::StrCat("rank ", options_.rank, ": response cache of process set ",
                     set.id, " out of step with the coordinator")));
    return;
  }
  if (response.type() == wire::RESPONSE_ADD_PROCESS_SET) {
    std::vector<int> ranks(response.member_ranks().begin(),
                           response.member_ranks().end());
    absl::Status s =
        sets_->Create(response.new_process_set(), std::move(ranks)).status();
    auto entry = queue_->Take(set.id, response.names(0));
    if (entry) {
      entry->work->SetValue(response.new_process_set());
      entry->Complete(s);
    }
    if (!s.ok()) Fatal(s);
    return;
  }
  if (response.type() == wire::RESPONSE_REMOVE_PROCESS_SET) {
    absl::Status s = RemoveSet(response.target_process_set());
    auto entry = queue_->Take(set.id, response.names(0));
    if (entry) entry->Complete(s);
    return;
  }
  if (response.type() == wire::RESPONSE_JOIN) joined_ = false;

  std::vector<std::unique_ptr<TensorEntry>> taken;
  queue_->TakeAll(set.id, response.names(), &taken);
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.reserve(response.names_size());
  for (int i = 0; i < response.names_size(); ++i) {
    const std::string& name = response.names(i);
    std::unique_ptr<TensorEntry> entry = std::move(taken[i]);
    if (!entry && response.type() == wire::RESPONSE_ALLREDUCE && joined_) {
      // Joined: contribute zeros so that the others' sums go on.
      entry = std::make_unique<TensorEntry>();
      const DataType dtype = static_cast<DataType>(response.dtype());
      entry->scratch = std::make_shared<std::vector<uint8_t>>(
          response.elements(i) * DataTypeSize(dtype));
      Device device;
      if (response.device_type() == static_cast<int>(DeviceType::kCuda)) {
        const int index = set.cuda_device.load();
        device = Device::Cuda(index >= 0 ? index : options_.local_rank);
      }
      entry->input = entry->output = TensorView(entry->scratch->data(), dtype,
                                                {response.elements(i)}, device);
      entry->work = std::make_shared<internal::WorkState>();
    }
    if (!entry) {
      if (response.type() == wire::RESPONSE_ERROR) continue;  // Not ours.
      // Every rank submitted every name of a data response: this one did
      // not, so the ranks are out of step.
      Fatal(absl::InternalError(
          absl::StrCat("rank ", options_.rank, " received a response for \"",
                       name, "\" that it never submitted")));
      return;
    }
    entries.push_back(std::move(entry));
  }
  if (apply_cache) {
    // Note [One cache protocol], as the coordinator applied it. Every name
    // of a data response has its entry, in order (or Fatal above).
    ApplyResponse(
        *set.cache, compact,
        [&](int i) -> const wire::Request* { return &entries[i]->request; }, 0);
  }
  if (entries.empty()) return;
  if (response.type() != wire::RESPONSE_ERROR) {
    ++counters_.collectives_executed;
    counters_.tensors_executed += static_cast<int64_t>(entries.size());
  }
  Executor* executor = set.executor.get();
  if (response.device_type() == static_cast<int>(DeviceType::kCuda)) {
    absl::Status connected =
        sets_->ConnectDevicePath(set, entries.front()->input.device);
    if (!connected.ok()) {
      for (auto& e : entries) e->Complete(connected);
      Fatal(connected);
      return;
    }
    executor = set.cuda_executor.get();
  }
  if (clock.on()) counters_.prepare_ns += clock.Lap();
  const int64_t completed_before = executor->complete_ns();
  absl::Status s = executor->Execute(response, entries);
  if (clock.on()) {
    const int64_t complete = executor->complete_ns() - completed_before;
    counters_.collective_ns += clock.Lap() - complete;
    counters_.complete_ns += complete;
  }
  // Note [Entries recycled]: the completed entries serve later submissions
  // (those a device backend completes later are its own until then).
  queue_->Recycle(&entries);
  if (clock.on()) counters_.recycle_ns += clock.Lap();
  if (!s.ok()) Fatal(explain_(s));
}

}  // namespace kolo
