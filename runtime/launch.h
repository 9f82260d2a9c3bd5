// Where this process stands in a job started by a launcher (torchrun-style env, Open MPI's
// mpirun, Slurm's srun): its rank, the world size, its index on its node, and where the ranks
// can meet (MASTER_ADDR/MASTER_PORT). A process started on its own is rank 0 of 1.
#pragma once
#include <functional>
#include <string>

namespace yolo {

struct LaunchInfo {
  int rank = 0, world = 1, local_rank = 0;
  std::string launcher;      // "mpirun", "srun", "torchrun", or "" (not launched: a single process)
  std::string master_addr;   // MASTER_ADDR when set
  int master_port = 0;       // MASTER_PORT when set
};

// Reads the launchers' variables, first match wins: RANK/WORLD_SIZE/LOCAL_RANK (torchrun
// style), OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK (Open MPI), SLURM_PROCID/SLURM_STEP_NUM_TASKS/
// SLURM_LOCALID (an srun step; a batch script, which has SLURM_PROCID but no step, is one
// process). A malformed or out-of-range value throws yolo::Error naming the variable and value.
// getenv is passed in so tests can feed any environment; the program passes
// [](const char* name) { return std::getenv(name); }.
LaunchInfo detect_launch(const std::function<const char*(const char*)>& getenv_fn);

// "tcp://MASTER_ADDR:MASTER_PORT" when both are set, else "".
std::string default_rendezvous(const LaunchInfo& info);

}  // namespace yolo
