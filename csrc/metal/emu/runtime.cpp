// Fiber scheduler behind metal_emu.h: runs the threads of one threadgroup as cooperative
// fibers so that threadgroup barriers and SIMD-group operations are real rendezvous points.
//
// Invariant kept: a launch is deterministic. Threadgroups run one after another in grid order;
// inside a threadgroup the fibers run round robin in a fixed order (forward, or reversed on
// request so that a test can show a kernel does not depend on it). A barrier or SIMD-group
// operation that not every thread reaches, or that lanes reach as different operations, stops
// the launch with an error instead of hanging.
#if defined(__APPLE__) && !defined(_XOPEN_SOURCE)
#define _XOPEN_SOURCE 600  // macOS hides the ucontext functions without it
#define _DARWIN_C_SOURCE
#endif
#define METAL_EMU_RUNTIME
#include "metal_emu.h"

#include <ucontext.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace metal_emu {
namespace {

constexpr size_t kStackBytes = 128 * 1024;
constexpr uint kLanes = 32;

enum class FiberState { kReady, kAtBarrier, kAtSimd, kDone };

struct Fiber {
  ucontext_t context;
  FiberState state = FiberState::kReady;
  ThreadAttributes attributes;
  uint simd_operations_done = 0;
};

// Two exchange slots per SIMD-group: lanes released from operation n may already deposit for
// operation n+1 while slower lanes still read the values of operation n.
struct SimdGroup {
  uint32_t values[2][kLanes];
  uint32_t kind[2] = {0, 0};
  uint arrived[2] = {0, 0};
};

struct Launch {
  ThreadEntry entry = nullptr;
  void* context = nullptr;
  std::vector<Fiber> fibers;
  std::vector<SimdGroup> simdgroups;
  ucontext_t scheduler;
  size_t current = 0;
  uint at_barrier = 0;
  bool failed = false;
  std::string error;
};

Launch* active = nullptr;
std::mutex launch_mutex;  // one launch at a time: threadgroup arrays are process-wide statics
// Fiber stacks, kept across launches (guarded by launch_mutex).
std::vector<std::unique_ptr<char[]>> stack_pool;

void fiber_main() {
  Fiber& fiber = active->fibers[active->current];
  active->entry(active->context, &fiber.attributes);
  fiber.state = FiberState::kDone;
  swapcontext(&fiber.context, &active->scheduler);
}

void yield_to_scheduler() {
  Fiber& fiber = active->fibers[active->current];
  swapcontext(&fiber.context, &active->scheduler);
}

std::string describe_states(const Launch& run) {
  uint ready = 0, barrier = 0, simd = 0, done = 0;
  for (const Fiber& fiber : run.fibers) {
    switch (fiber.state) {
      case FiberState::kReady: ++ready; break;
      case FiberState::kAtBarrier: ++barrier; break;
      case FiberState::kAtSimd: ++simd; break;
      case FiberState::kDone: ++done; break;
    }
  }
  return std::to_string(barrier) + " threads at threadgroup_barrier, " + std::to_string(simd) +
         " at a SIMD-group operation, " + std::to_string(done) + " finished";
}

bool run_threadgroup(Launch& run, int reverse_order) {
  const size_t count = run.fibers.size();
  for (size_t i = 0; i < count; ++i) {
    Fiber& fiber = run.fibers[i];
    fiber.state = FiberState::kReady;
    fiber.simd_operations_done = 0;
    getcontext(&fiber.context);
    fiber.context.uc_stack.ss_sp = stack_pool[i].get();
    fiber.context.uc_stack.ss_size = kStackBytes;
    fiber.context.uc_link = nullptr;
    makecontext(&fiber.context, fiber_main, 0);
  }
  for (SimdGroup& group : run.simdgroups) group = SimdGroup();
  run.at_barrier = 0;
  for (;;) {
    bool progressed = false;
    size_t done = 0;
    for (size_t step = 0; step < count; ++step) {
      size_t i = reverse_order ? count - 1 - step : step;
      if (run.fibers[i].state == FiberState::kReady) {
        run.current = i;
        swapcontext(&run.scheduler, &run.fibers[i].context);
        progressed = true;
        if (run.failed) return false;
      }
      if (run.fibers[i].state == FiberState::kDone) ++done;
    }
    if (done == count) return true;
    if (!progressed) {
      run.failed = true;
      run.error = "threads of a threadgroup wait forever (" + describe_states(run) +
                  "): a barrier or SIMD-group operation is not reached by every thread";
      return false;
    }
  }
}

}  // namespace

void threadgroup_barrier_wait() {
  Launch& run = *active;
  run.fibers[run.current].state = FiberState::kAtBarrier;
  if (++run.at_barrier == run.fibers.size()) {
    for (Fiber& fiber : run.fibers) fiber.state = FiberState::kReady;
    run.at_barrier = 0;
  }
  yield_to_scheduler();
}

const uint32_t* simd_exchange(uint32_t bits, uint32_t kind) {
  Launch& run = *active;
  Fiber& fiber = run.fibers[run.current];
  const uint group_index = fiber.attributes.simdgroup_index_in_threadgroup;
  const uint lane = fiber.attributes.thread_index_in_simdgroup;
  SimdGroup& group = run.simdgroups[group_index];
  const uint slot = fiber.simd_operations_done & 1u;
  if (group.arrived[slot] == 0) {
    group.kind[slot] = kind;
  } else if (group.kind[slot] != kind) {
    fail("lanes of a SIMD-group reached different SIMD-group operations");
  }
  group.values[slot][lane] = bits;
  fiber.state = FiberState::kAtSimd;
  if (++group.arrived[slot] == kLanes) {
    const size_t first = (size_t)group_index * kLanes;
    for (size_t i = first; i < first + kLanes; ++i) run.fibers[i].state = FiberState::kReady;
    group.arrived[slot] = 0;
  }
  yield_to_scheduler();
  fiber.simd_operations_done += 1;
  return group.values[slot];
}

uint current_lane() { return active->fibers[active->current].attributes.thread_index_in_simdgroup; }

void fail(const char* message) {
  active->failed = true;
  active->error = message;
  yield_to_scheduler();
  __builtin_trap();  // a failed fiber is never resumed
}

int launch(ThreadEntry entry, void* context, const uint32_t grid[3],
           const uint32_t threadgroup[3], int reverse_order, char* error, int error_size) {
  std::lock_guard<std::mutex> lock(launch_mutex);
  auto report = [&](const std::string& message) {
    std::snprintf(error, (size_t)error_size, "%s", message.c_str());
    return 1;
  };
  uint64_t group_size = 1;
  uint3 groups;
  uint* group_counts[3] = {&groups.x, &groups.y, &groups.z};
  for (int axis = 0; axis < 3; ++axis) {
    if (threadgroup[axis] == 0 || grid[axis] % threadgroup[axis] != 0) {
      return report("grid must be a whole number of threadgroups in every dimension");
    }
    *group_counts[axis] = grid[axis] / threadgroup[axis];
    group_size *= threadgroup[axis];
  }
  if (group_size % kLanes != 0 || group_size > 1024) {
    return report("threads per threadgroup must be a multiple of 32 and at most 1024");
  }
  Launch run;
  run.entry = entry;
  run.context = context;
  run.fibers.resize(group_size);
  while (stack_pool.size() < group_size) stack_pool.emplace_back(new char[kStackBytes]);
  run.simdgroups.resize(group_size / kLanes);
  const uint3 tg_size = {threadgroup[0], threadgroup[1], threadgroup[2]};
  for (size_t i = 0; i < group_size; ++i) {
    ThreadAttributes& a = run.fibers[i].attributes;
    a.thread_position_in_threadgroup = {uint(i % tg_size.x), uint(i / tg_size.x % tg_size.y),
                                        uint(i / (tg_size.x * tg_size.y))};
    a.threads_per_threadgroup = tg_size;
    a.threadgroups_per_grid = groups;
    a.threads_per_grid = {grid[0], grid[1], grid[2]};
    a.thread_index_in_threadgroup = uint(i);
    a.thread_index_in_simdgroup = uint(i % kLanes);
    a.simdgroup_index_in_threadgroup = uint(i / kLanes);
    a.simdgroups_per_threadgroup = uint(group_size / kLanes);
    a.threads_per_simdgroup = kLanes;
    a.thread_execution_width = kLanes;
  }
  active = &run;
  for (uint gz = 0; gz < groups.z; ++gz) {
    for (uint gy = 0; gy < groups.y; ++gy) {
      for (uint gx = 0; gx < groups.x; ++gx) {
        for (Fiber& fiber : run.fibers) {
          ThreadAttributes& a = fiber.attributes;
          a.threadgroup_position_in_grid = {gx, gy, gz};
          a.thread_position_in_grid = {gx * tg_size.x + a.thread_position_in_threadgroup.x,
                                       gy * tg_size.y + a.thread_position_in_threadgroup.y,
                                       gz * tg_size.z + a.thread_position_in_threadgroup.z};
        }
        if (!run_threadgroup(run, reverse_order)) {
          active = nullptr;
          return report(run.error);
        }
      }
    }
  }
  active = nullptr;
  return 0;
}

}  // namespace metal_emu
