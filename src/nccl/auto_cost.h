// `auto`'s cost model: for the communicators NCCL would let us suspend, suspend or
// recreate, whichever makes this process's pause + resume shortest.
//
// Why a model and not "suspend wherever NCCL accepts it": NCCL's suspend moves every
// byte it frees through pinned host memory (about 1 s per GiB for suspend plus resume
// with 2.30.7), while a recreate ends every communicator at once on threads
// of its own and initialises them again in one group: about the same time whatever
// their size. Small communicators suspend faster (4 at NCCL's defaults: 51 ms against
// 180 ms); gigabytes of them recreate faster (12 GiB: 2.2 s against 11.1 s).
//
//   suspend(S bytes)  = S * (suspend + resume seconds per byte)
//   recreate(N)       = the slowest teardown + N * re-initialisation per communicator
//                       + what each one's last first collective took (NCCL connects
//                       there again after a recreate; a suspend keeps the connections)
//   a pause that does both at once (JAX_AMEM_NCCL_OVERLAP threads or group) costs the
//   longer of the two plus half the shorter (they share the host: CPU, pinned memory).
//
// The rates start from figures measured with NCCL 2.30.7 on an H200 and an H100
// (docs/benchmarks.md: 0.66 + 0.34 s/GiB at 12 GiB, teardowns of 0.17-1.0 s, 37 ms a
// re-initialisation) and are replaced by what this process measures: every suspend and resume of at least 64 MiB, every teardown and
// re-initialisation (a moving average, half old, half new).
// JAX_AMEM_NCCL_COST sets the starting rates (and can stop the learning), e.g.
// "suspend_s_per_gib=0.7,resume_s_per_gib=0.35,teardown_s=0.3,init_s=0.035,learn=0".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace amem::nccl {

struct PlanEntry;

struct CostRates {
  double suspend_s_per_gib = 0.70;  // ncclCommSuspend, per GiB suspendable
  double resume_s_per_gib = 0.35;   // ncclCommResume, per GiB restored
  double teardown_s = 0.30;         // the slowest ncclCommDestroy of a pause
  double init_s = 0.035;            // re-initialisation in one group, per communicator
  bool learn = true;                // measured pauses update the rates
  int suspend_samples = 0;          // how many measurements each rate holds
  int resume_samples = 0;
  int teardown_samples = 0;
  int init_samples = 0;
};

// The rates `auto` uses now. Fails (naming the variable, the bad part and the form
// expected) when JAX_AMEM_NCCL_COST cannot be read; the rates are then unchanged.
Status CurrentRates(CostRates* rates);

// Estimated seconds for one pause + resume.
double SuspendSeconds(const CostRates& rates, int64_t bytes);
double RecreateSeconds(const CostRates& rates, int communicators);
double BothSeconds(double suspend, double recreate, bool overlapped);

// What a pause measured (no-ops when the rates do not learn; suspends and resumes of
// less than 64 MiB are left out: their fixed costs would pass for a rate).
void RecordSuspend(int64_t bytes, double seconds);
void RecordResume(int64_t bytes, double seconds);
void RecordTeardown(double slowest_seconds);
void RecordReinit(int communicators, double seconds);
void ResetCostModel();  // back to the starting rates (tests)

// For the entries `auto` planned to suspend and that could be recreated as well:
// recreates the communicators that save the most while that shortens this
// process's pause + resume, plus the connections the recreated ones make again at
// their first collective (each one's last first collective, first_use.h), by at
// least 10%, and writes each choice's why.
// All local ranks of a communicator (same key) go the same way. `decides(key)`:
// whether this process may choose by cost for that communicator (an agreement makes
// every rank's choice the same, or every rank of it is in this process).
Status ChooseByCost(std::vector<PlanEntry>* plan, const std::vector<bool>& decides);

// The rates as JSON, for the report and communicators().
std::string CostRatesJson(const CostRates& rates);

}  // namespace amem::nccl
