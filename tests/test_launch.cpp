// Launcher detection: each launcher's variables, which one wins, Slurm batch scripts as one
// process, every malformed value named in the error, and the default rendezvous address.
#include <doctest/doctest.h>

#include <map>
#include <string>

#include "runtime/check.h"
#include "runtime/launch.h"
#include "tests/test_support.h"

using namespace yolo;

namespace {

using Env = std::map<std::string, std::string>;

LaunchInfo detect(const Env& env) {
  return detect_launch([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

// The message of the Error that detect(env) throws, or "" when it does not throw.
std::string detect_error(const Env& env) {
  try {
    detect(env);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("detect_launch: no launcher is rank 0 of 1") {
  LaunchInfo info = detect({{"HOME", "/root"}});
  CHECK(info.rank == 0);
  CHECK(info.world == 1);
  CHECK(info.local_rank == 0);
  CHECK(info.launcher == "");
  CHECK(info.master_addr == "");
  CHECK(info.master_port == 0);
  CHECK(default_rendezvous(info) == "");
}

TEST_CASE("detect_launch: each launcher's variables") {
  LaunchInfo torchrun = detect({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                {"MASTER_ADDR", "node-0.cluster"}, {"MASTER_PORT", "29500"}});
  CHECK(torchrun.launcher == "torchrun");
  CHECK(torchrun.rank == 5);
  CHECK(torchrun.world == 8);
  CHECK(torchrun.local_rank == 1);
  CHECK(torchrun.master_addr == "node-0.cluster");
  CHECK(torchrun.master_port == 29500);
  CHECK(default_rendezvous(torchrun) == "tcp://node-0.cluster:29500");

  LaunchInfo mpi = detect({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}});
  CHECK(mpi.launcher == "mpirun");
  CHECK(mpi.rank == 3);
  CHECK(mpi.world == 4);
  CHECK(mpi.local_rank == 3);
  CHECK(default_rendezvous(mpi) == "");

  LaunchInfo srun = detect({{"SLURM_PROCID", "6"}, {"SLURM_STEP_NUM_TASKS", "16"}, {"SLURM_NTASKS", "16"},
                            {"SLURM_LOCALID", "2"}});
  CHECK(srun.launcher == "srun");
  CHECK(srun.rank == 6);
  CHECK(srun.world == 16);
  CHECK(srun.local_rank == 2);
}

TEST_CASE("detect_launch: a Slurm batch script (no srun step) is one process") {
  // sbatch -n 4 sets SLURM_PROCID=0 and SLURM_NTASKS=4 for the script itself, which is one process.
  LaunchInfo info = detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}, {"SLURM_JOB_ID", "77"}});
  CHECK(info.launcher == "");
  CHECK(info.world == 1);
  CHECK(info.rank == 0);
}

TEST_CASE("detect_launch: torchrun-style wins over Open MPI, which wins over Slurm") {
  Env slurm = {{"SLURM_PROCID", "1"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_LOCALID", "1"}};
  Env mpi = slurm;
  mpi.insert({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "3"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}});
  Env all = mpi;
  all.insert({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}});
  LaunchInfo a = detect(all), m = detect(mpi), s = detect(slurm);
  CHECK(a.launcher == "torchrun");
  CHECK(a.rank == 3);
  CHECK(a.world == 4);
  CHECK(m.launcher == "mpirun");
  CHECK(m.rank == 2);
  CHECK(m.world == 3);
  CHECK(m.local_rank == 0);
  CHECK(s.launcher == "srun");
  CHECK(s.rank == 1);
  CHECK(s.world == 2);
}

TEST_CASE("detect_launch: a missing local rank is 0 for one process and an error for several") {
  LaunchInfo single = detect({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  CHECK(single.world == 1);
  CHECK(single.local_rank == 0);
  std::string error = detect_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  CHECK(error.find("LOCAL_RANK") != std::string::npos);
  CHECK(error.find("is not") != std::string::npos);
}

TEST_CASE("detect_launch: every bad value is an error naming the variable and the value") {
  struct Case {
    Env env;
    std::string words1, words2;
  };
  const Env base = {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}};
  auto with = [&](const std::string& name, const std::string& value) {
    Env env = base;
    env[name] = value;
    return env;
  };
  std::vector<Case> cases = {
      {with("RANK", "abc"), "RANK='abc'", "whole number"},
      {with("RANK", ""), "RANK=''", "whole number"},
      {with("RANK", "1.5"), "RANK='1.5'", "whole number"},
      {with("RANK", " 1"), "RANK=' 1'", "whole number"},
      {with("RANK", "-1"), "RANK='-1'", "outside 0..3"},
      {with("RANK", "4"), "RANK='4'", "outside 0..3"},
      {with("RANK", "99999999999999999999999"), "RANK='99999999999999999999999'", "whole number"},
      {with("WORLD_SIZE", "0"), "WORLD_SIZE='0'", "1 or more"},
      {with("WORLD_SIZE", "-2"), "WORLD_SIZE='-2'", "1 or more"},
      {with("WORLD_SIZE", "four"), "WORLD_SIZE='four'", "whole number"},
      {with("LOCAL_RANK", "-1"), "LOCAL_RANK='-1'", "outside"},
      {with("LOCAL_RANK", "4"), "LOCAL_RANK='4'", "outside"},
      {with("LOCAL_RANK", "x1"), "LOCAL_RANK='x1'", "whole number"},
      {with("MASTER_PORT", "0"), "MASTER_PORT='0'", "1..65535"},
      {with("MASTER_PORT", "65536"), "MASTER_PORT='65536'", "1..65535"},
      {with("MASTER_PORT", "http"), "MASTER_PORT='http'", "whole number"},
      {with("MASTER_ADDR", ""), "MASTER_ADDR", "empty"},
      {{{"RANK", "1"}}, "WORLD_SIZE", "is not"},
      {{{"WORLD_SIZE", "2"}}, "RANK", "is not"},
      {{{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}},
       "OMPI_COMM_WORLD_RANK='2'", "outside 0..1"},
      {{{"OMPI_COMM_WORLD_RANK", "0"}}, "OMPI_COMM_WORLD_SIZE", "is not"},
      {{{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "2x"}, {"SLURM_LOCALID", "0"}},
       "SLURM_STEP_NUM_TASKS='2x'", "whole number"},
      {{{"SLURM_PROCID", "1"}, {"SLURM_STEP_NUM_TASKS", "2"}}, "SLURM_LOCALID", "is not"},
  };
  for (const Case& c : cases) {
    std::string error = detect_error(c.env);
    CAPTURE(error);
    CHECK(error.find(c.words1) != std::string::npos);
    CHECK(error.find(c.words2) != std::string::npos);
  }
}

TEST_CASE("default_rendezvous: needs both MASTER_ADDR and MASTER_PORT; IPv6 gets brackets") {
  LaunchInfo info;
  info.master_addr = "10.0.0.7";
  CHECK(default_rendezvous(info) == "");
  info.master_port = 1234;
  CHECK(default_rendezvous(info) == "tcp://10.0.0.7:1234");
  info.master_addr = "fd00::7";
  CHECK(default_rendezvous(info) == "tcp://[fd00::7]:1234");
  info.master_addr = "";
  CHECK(default_rendezvous(info) == "");
}
