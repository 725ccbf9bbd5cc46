#include "nccl/auto_cost.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include "nccl/mem_stats.h"
#include "nccl/overlap.h"
#include "nccl/pause_plan.h"

namespace amem::nccl {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;
constexpr int64_t kLearnFrom = int64_t{64} << 20;  // bytes: below, fixed costs pass for a rate
constexpr double kOverlapShare = 0.5;              // of the shorter job, when both run at once
constexpr double kGain = 0.9;                      // recreate only to be at least 10% faster
constexpr double kMinSaving = 0.005;               // ... and 5 ms

std::mutex& RatesMutex() {
  static auto* mutex = new std::mutex();
  return *mutex;
}

// What this process measured; used once learned_any is set (until then, and after a
// reset, the starting rates come from JAX_AMEM_NCCL_COST or the defaults, read at each plan).
CostRates* Learned() {
  static CostRates rates;
  return &rates;
}
bool learned_any = false;  // under RatesMutex()

// "key=value,key=value" -> rates; the message names what is wrong.
Status ParseCost(const char* text, CostRates* rates) {
  const std::string form =
      " Expected comma-separated KEY=NUMBER with keys suspend_s_per_gib, resume_s_per_gib, "
      "teardown_s, init_s (seconds, >= 0) and learn (0 or 1), e.g. "
      "JAX_AMEM_NCCL_COST=suspend_s_per_gib=0.7,teardown_s=0.3; or unset it for the defaults.";
  std::stringstream parts(text);
  std::string part;
  while (std::getline(parts, part, ',')) {
    if (part.empty()) continue;
    const size_t equals = part.find('=');
    const std::string key = part.substr(0, equals);
    const std::string value = equals == std::string::npos ? "" : part.substr(equals + 1);
    char* end = nullptr;
    const double number = value.empty() ? -1 : std::strtod(value.c_str(), &end);
    const bool readable = !value.empty() && end != nullptr && *end == '\0' && number >= 0 && number < 1e12;
    if (!readable) {
      return Status::Error("JAX_AMEM_NCCL_COST: '" + part + "' is not KEY=NUMBER with a number >= 0." + form);
    }
    if (key == "suspend_s_per_gib") rates->suspend_s_per_gib = number;
    else if (key == "resume_s_per_gib") rates->resume_s_per_gib = number;
    else if (key == "teardown_s") rates->teardown_s = number;
    else if (key == "init_s") rates->init_s = number;
    else if (key == "learn" && (number == 0 || number == 1)) rates->learn = number == 1;
    else return Status::Error("JAX_AMEM_NCCL_COST: unknown key or value in '" + part + "'." + form);
  }
  return Status::Ok();
}

Status StartingRates(CostRates* rates) {
  *rates = CostRates();
  const char* text = std::getenv("JAX_AMEM_NCCL_COST");
  return text == nullptr ? Status::Ok() : ParseCost(text, rates);
}

// Half the old value, half the new one; the first measurement replaces the start.
void Update(double* rate, int* samples, double measured) {
  *rate = *samples == 0 ? measured : 0.5 * (*rate + measured);
  ++*samples;
}

template <typename Apply>
void Learn(Apply apply) {
  std::lock_guard<std::mutex> guard(RatesMutex());
  CostRates start;
  if (!StartingRates(&start).ok() || !start.learn) return;
  if (!learned_any) {
    *Learned() = start;
    learned_any = true;
  }
  apply(Learned());
}

std::string Seconds(double seconds) {
  char text[32];
  if (seconds >= 1) std::snprintf(text, sizeof(text), "%.2f s", seconds);
  else std::snprintf(text, sizeof(text), "%.1f ms", seconds * 1e3);
  return text;
}

std::string Size(int64_t bytes) {
  char text[32];
  if (bytes >= (int64_t{1} << 30)) std::snprintf(text, sizeof(text), "%.1f GiB", bytes / kGiB);
  else if (bytes >= (int64_t{1} << 20)) std::snprintf(text, sizeof(text), "%.1f MiB", bytes / (1024.0 * 1024));
  else std::snprintf(text, sizeof(text), "%lld bytes", static_cast<long long>(bytes));
  return text;
}

std::string Number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", value);
  return text;
}

std::string Source(int samples) {
  return samples == 0 ? "the starting rate" : "measured, " + std::to_string(samples) + " sample(s)";
}

// One communicator as `auto` sees it here: all of its ranks in this process.
struct Unit {
  std::vector<PlanEntry*> entries;
  int64_t bytes = 0;
  double connect_seconds = 0;  // its ranks' last first collectives (0 where none ran yet)
};

}  // namespace

Status CurrentRates(CostRates* rates) {
  CostRates start;
  Status status = StartingRates(&start);
  if (!status.ok()) return status;
  std::lock_guard<std::mutex> guard(RatesMutex());
  *rates = (learned_any && start.learn) ? *Learned() : start;
  return Status::Ok();
}

double SuspendSeconds(const CostRates& rates, int64_t bytes) {
  return bytes <= 0 ? 0 : bytes / kGiB * (rates.suspend_s_per_gib + rates.resume_s_per_gib);
}

double RecreateSeconds(const CostRates& rates, int communicators) {
  return communicators <= 0 ? 0 : rates.teardown_s + communicators * rates.init_s;
}

double BothSeconds(double suspend, double recreate, bool overlapped) {
  if (!overlapped) return suspend + recreate;
  return std::max(suspend, recreate) + kOverlapShare * std::min(suspend, recreate);
}

void RecordSuspend(int64_t bytes, double seconds) {
  if (bytes < kLearnFrom) return;
  Learn([&](CostRates* r) { Update(&r->suspend_s_per_gib, &r->suspend_samples, seconds / (bytes / kGiB)); });
}

void RecordResume(int64_t bytes, double seconds) {
  if (bytes < kLearnFrom) return;
  Learn([&](CostRates* r) { Update(&r->resume_s_per_gib, &r->resume_samples, seconds / (bytes / kGiB)); });
}

void RecordTeardown(double slowest_seconds) {
  Learn([&](CostRates* r) { Update(&r->teardown_s, &r->teardown_samples, slowest_seconds); });
}

void RecordReinit(int communicators, double seconds) {
  if (communicators <= 0) return;
  Learn([&](CostRates* r) { Update(&r->init_s, &r->init_samples, seconds / communicators); });
}

void ResetCostModel() {
  std::lock_guard<std::mutex> guard(RatesMutex());
  learned_any = false;
}

std::string CostRatesJson(const CostRates& r) {
  std::ostringstream out;
  out << "{\"suspend_s_per_gib\":" << r.suspend_s_per_gib << ",\"resume_s_per_gib\":" << r.resume_s_per_gib
      << ",\"teardown_s\":" << r.teardown_s << ",\"init_s\":" << r.init_s
      << ",\"learn\":" << (r.learn ? "true" : "false") << ",\"suspend_samples\":" << r.suspend_samples
      << ",\"resume_samples\":" << r.resume_samples << ",\"teardown_samples\":" << r.teardown_samples
      << ",\"init_samples\":" << r.init_samples << "}";
  return out.str();
}

Status ChooseByCost(std::vector<PlanEntry>* plan, const std::vector<bool>& decides) {
  CostRates rates;
  Status status = CurrentRates(&rates);
  if (!status.ok()) return status;
  // What is fixed: communicators NCCL makes us recreate, and suspends that cannot
  // become recreates (registered buffers, windows, device communicators; or no
  // agreement to make the choice the same on every rank).
  int fixed_recreates = 0;
  int64_t fixed_suspend = 0;
  std::map<std::string, Unit> units;
  std::map<std::string, bool> pinned;  // a key with any entry that must suspend stays whole
  for (size_t i = 0; i < plan->size(); ++i) {
    PlanEntry& entry = (*plan)[i];
    if (entry.refused || entry.strategy != Strategy::kSuspend) continue;
    const ProxyComm& comm = *entry.comm;
    const bool movable = decides[i] && comm.real != nullptr &&
                         comm.registrations + comm.windows + comm.device_comms == 0;
    pinned[comm.key] = pinned[comm.key] || !movable;
  }
  for (PlanEntry& entry : *plan) {
    if (entry.refused) continue;
    if (entry.strategy == Strategy::kRecreate) {
      ++fixed_recreates;
      continue;
    }
    const ProxyComm& comm = *entry.comm;
    const int64_t bytes = std::max<int64_t>(MemStat(comm.real, kNcclStatGpuMemSuspend), 0);
    if (pinned[comm.key]) {
      fixed_suspend += bytes;
      if (!decides[&entry - plan->data()]) {
        entry.why += "; not chosen by cost: without an agreement another rank could choose otherwise";
      }
      continue;
    }
    Unit& unit = units[comm.key];
    unit.entries.push_back(&entry);
    unit.bytes += bytes;
    unit.connect_seconds += std::max(comm.connect_seconds.load(), 0.0);
  }
  std::vector<Unit*> order;
  int64_t movable_bytes = 0;
  for (auto& [key, unit] : units) {
    order.push_back(&unit);
    movable_bytes += unit.bytes;
  }
  // The most a recreate would save first: its suspend time less the connections it
  // makes again at its first collective (by size alone where none has run yet).
  auto saving = [&](const Unit* unit) { return SuspendSeconds(rates, unit->bytes) - unit->connect_seconds; };
  std::stable_sort(order.begin(), order.end(), [&](const Unit* a, const Unit* b) { return saving(a) > saving(b); });

  // Recreate the first k (k = 0 .. all); keep the cheapest. The connections are made
  // after resume, at the next step's first collectives: added, not overlapped.
  const bool overlapped = Concurrent();
  auto cost = [&](size_t k, int* recreates, int64_t* suspended) {
    *recreates = fixed_recreates;
    *suspended = fixed_suspend + movable_bytes;
    double connect = 0;
    for (size_t j = 0; j < k; ++j) {
      *recreates += static_cast<int>(order[j]->entries.size());
      *suspended -= order[j]->bytes;
      connect += order[j]->connect_seconds;
    }
    return BothSeconds(SuspendSeconds(rates, *suspended), RecreateSeconds(rates, *recreates), overlapped) + connect;
  };
  int recreates = 0;
  int64_t suspended = 0;
  const double all_recreate = cost(order.size(), &recreates, &suspended);
  const double all_suspend = cost(0, &recreates, &suspended);
  size_t best = 0;
  double best_cost = all_suspend;
  for (size_t k = 1; k <= order.size(); ++k) {
    const double c = cost(k, &recreates, &suspended);
    if (c < best_cost) best = k, best_cost = c;
  }
  if (best_cost > kGain * all_suspend || all_suspend - best_cost < kMinSaving) best = 0;
  cost(best, &recreates, &suspended);
  const double chosen = best == 0 ? all_suspend : best_cost;

  const std::string rates_said =
      " (suspend " + Number(rates.suspend_s_per_gib) + " + resume " + Number(rates.resume_s_per_gib) +
      " s/GiB, " + Source(rates.suspend_samples) +
      "; teardown " + Seconds(rates.teardown_s) + " + " + Seconds(rates.init_s) +
      " per re-initialisation, " + Source(rates.teardown_samples) + ")";
  double measured_connect = 0;
  for (const Unit* unit : order) measured_connect += unit->connect_seconds;
  const std::string connect_said =
      measured_connect <= 0 ? ""
                            : "; recreating includes connecting again at the first collective, " +
                                  Seconds(measured_connect) + " as last measured for these";
  const std::string plan_said =
      "; this process: suspend " + Size(suspended) + " and recreate " + std::to_string(recreates) +
      " communicator(s), estimated " + Seconds(chosen) + " for pause + resume, against " +
      Seconds(all_suspend) + " suspending all it can and " + Seconds(all_recreate) + " recreating" +
      rates_said + connect_said;
  for (size_t j = 0; j < order.size(); ++j) {
    const std::string connect =
        order[j]->connect_seconds > 0 ? ", its first collective " + Seconds(order[j]->connect_seconds) : "";
    for (PlanEntry* entry : order[j]->entries) {
      if (j < best) entry->strategy = Strategy::kRecreate;
      entry->why += "; by cost: " + Size(order[j]->bytes) + " suspendable" + connect + plan_said;
    }
  }
  return Status::Ok();
}

}  // namespace amem::nccl
