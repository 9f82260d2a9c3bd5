// Launcher detection (see launch.h): each launcher's variables, validated strictly, because a
// wrong rank or world size would make the job wait for ranks that never come.
#include "runtime/launch.h"

#include <charconv>
#include <optional>
#include <string_view>

#include "runtime/check.h"

namespace yolo {
namespace {

using Getenv = std::function<const char*(const char*)>;

// The variables one launcher sets for each process.
struct LauncherVars {
  const char* launcher;
  const char* rank;
  const char* world;
  const char* local_rank;
};

std::string quoted(const char* name, const char* value) { return std::string(name) + "='" + value + "'"; }

// The value of `name` as a whole number, or nothing when it is unset.
std::optional<long long> env_integer(const Getenv& getenv_fn, const char* name) {
  const char* text = getenv_fn(name);
  if (!text) return std::nullopt;
  std::string_view view(text);
  long long value = 0;
  auto [end, status] = std::from_chars(view.data(), view.data() + view.size(), value);
  if (view.empty() || status != std::errc() || end != view.data() + view.size())
    throw Error(quoted(name, text) + " is not a whole number: the launcher's environment is broken; set it to an "
                "integer or unset it");
  return value;
}

// Rank, world and local rank from one launcher's variables (the caller saw at least one of them).
LaunchInfo read_launcher(const Getenv& getenv_fn, const LauncherVars& vars) {
  std::optional<long long> rank = env_integer(getenv_fn, vars.rank);
  std::optional<long long> world = env_integer(getenv_fn, vars.world);
  std::optional<long long> local = env_integer(getenv_fn, vars.local_rank);
  if (!world)
    throw Error(std::string(vars.rank) + " is set but " + vars.world + " is not: a " + vars.launcher +
                "-style launch sets both; set " + vars.world + " to the number of processes, or unset " + vars.rank);
  if (!rank)
    throw Error(std::string(vars.world) + " is set but " + vars.rank + " is not: a " + vars.launcher +
                "-style launch sets both; set " + vars.rank + " to this process's rank, or unset " + vars.world);
  const std::string world_text = getenv_fn(vars.world), rank_text = getenv_fn(vars.rank);
  if (*world < 1 || *world > (1 << 24))
    throw Error(quoted(vars.world, world_text.c_str()) + ": the number of processes must be 1 or more");
  if (*rank < 0 || *rank >= *world)
    throw Error(quoted(vars.rank, rank_text.c_str()) + " is outside 0.." + std::to_string(*world - 1) + " (" +
                quoted(vars.world, world_text.c_str()) + ")");
  LaunchInfo info;
  info.launcher = vars.launcher;
  info.rank = static_cast<int>(*rank);
  info.world = static_cast<int>(*world);
  if (local) {
    if (*local < 0 || *local >= *world)
      throw Error(quoted(vars.local_rank, getenv_fn(vars.local_rank)) + " is outside 0.." +
                  std::to_string(*world - 1) + " (" + quoted(vars.world, world_text.c_str()) + ")");
    info.local_rank = static_cast<int>(*local);
  } else if (*world > 1) {
    // Guessing would put several processes on one GPU, or pick GPUs that other jobs use.
    throw Error(std::string(vars.rank) + " and " + vars.world + " are set but " + vars.local_rank +
                " is not: set " + vars.local_rank + " to this process's index on its node (it picks the GPU)");
  }
  return info;
}

}  // namespace

LaunchInfo detect_launch(const Getenv& getenv_fn) {
  static const LauncherVars torchrun{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"};
  static const LauncherVars open_mpi{"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                     "OMPI_COMM_WORLD_LOCAL_RANK"};
  static const LauncherVars slurm{"srun", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"};
  LaunchInfo info;
  if (getenv_fn(torchrun.rank) || getenv_fn(torchrun.world)) {
    info = read_launcher(getenv_fn, torchrun);
  } else if (getenv_fn(open_mpi.rank) || getenv_fn(open_mpi.world)) {
    info = read_launcher(getenv_fn, open_mpi);
  } else if (getenv_fn(slurm.rank) && getenv_fn(slurm.world)) {
    // Only an srun step has SLURM_STEP_NUM_TASKS; a batch script has SLURM_PROCID=0 and the
    // allocation's SLURM_NTASKS, but it is one process.
    info = read_launcher(getenv_fn, slurm);
  }
  if (const char* addr = getenv_fn("MASTER_ADDR")) {
    if (!*addr) throw Error("MASTER_ADDR is set but empty: set it to rank 0's host name or address, or unset it");
    info.master_addr = addr;
  }
  if (std::optional<long long> port = env_integer(getenv_fn, "MASTER_PORT")) {
    if (*port < 1 || *port > 65535)
      throw Error(quoted("MASTER_PORT", getenv_fn("MASTER_PORT")) + " is outside 1..65535");
    info.master_port = static_cast<int>(*port);
  }
  return info;
}

std::string default_rendezvous(const LaunchInfo& info) {
  if (info.master_addr.empty() || info.master_port == 0) return "";
  // An IPv6 literal needs brackets to keep its colons apart from the port's.
  bool ipv6 = info.master_addr.find(':') != std::string::npos && info.master_addr.front() != '[';
  std::string host = ipv6 ? "[" + info.master_addr + "]" : info.master_addr;
  return "tcp://" + host + ":" + std::to_string(info.master_port);
}

}  // namespace yolo
