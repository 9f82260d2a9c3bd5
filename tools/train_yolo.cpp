// train_yolo: the command users run. Today it discovers devices, chooses the backend and
// reports it; the cfg -> graph -> executor path that trains YOLOv3 lands with the graph issue.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/check.h"
#include "runtime/device.h"

namespace {

const char* kUsage =
    "usage: train_yolo [options]\n"
    "  --list-devices     print the GPUs, NCCL and CPU this machine offers, then exit\n"
    "  --devices SPEC     auto (default: every GPU, else the CPU), cpu, cpu:N, gpu, gpu:I,J,...\n"
    "  --help             this text\n";

struct Options {
  bool list_devices = false;
  std::string devices = "auto";
};

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const std::string& flag) -> std::string {
      if (i + 1 >= argc) throw yolo::Error(flag + " needs a value\n" + kUsage);
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (arg == "--list-devices") {
      options.list_devices = true;
    } else if (arg == "--devices") {
      options.devices = value(arg);
    } else if (arg.rfind("--devices=", 0) == 0) {
      options.devices = arg.substr(std::strlen("--devices="));
    } else {
      throw yolo::Error("unknown option '" + arg + "'\n" + kUsage);
    }
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options options = parse(argc, argv);
    const yolo::GpuDiscovery& found = yolo::discover_gpus();
    if (options.list_devices) {
      std::fputs(yolo::describe_devices(found).c_str(), stdout);
      return 0;
    }
    yolo::DeviceChoice choice = yolo::choose_devices(options.devices, found);
    std::printf("train_yolo: %s\n", choice.reason.c_str());
    std::printf("train_yolo: devices:");
    for (const yolo::Device& d : choice.devices) std::printf(" %s", d.name().c_str());
    std::printf("\ntrain_yolo: the runtime is ready; training (cfg -> graph -> executor) is not built yet "
                "(see README.md, Status)\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_yolo: error: %s\n", e.what());
    return 2;
  }
}
