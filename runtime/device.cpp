// Device discovery and the --devices choice (see device.h).
#include "runtime/device.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <sstream>
#include <thread>

#include "runtime/check.h"
#include "runtime/nccl_loader.h"
#if YOLO_EMULATED_KERNELS
#include "runtime/emu/device.h"
#endif

namespace yolo {

std::string Device::name() const {
  switch (kind) {
    case DeviceKind::Cuda: return "gpu:" + std::to_string(index);
    case DeviceKind::Emu: return "emu:" + std::to_string(index);
    default: return "cpu";
  }
}

int cpu_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : int(n);
}

namespace {

// The GPUs that cannot run this build, each with why: "gpu:0 (Tesla V100) cannot run this build: ...".
std::string left_out(const GpuDiscovery& found) {
  std::string text;
  for (const GpuInfo& g : found.unusable)
    text += (text.empty() ? "" : "; ") + std::string("gpu:") + std::to_string(g.index) + " (" + g.name +
            ") cannot run this build: " + g.code.why;
  return text;
}

GpuDiscovery discover() {
  GpuDiscovery found;
#if YOLO_CUDA
  found.cuda_built = true;
  cudaDriverGetVersion(&found.driver_version);
  cudaRuntimeGetVersion(&found.runtime_version);
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    if (status == cudaErrorInsufficientDriver && found.driver_version == 0)
      found.why_no_gpu = "no CUDA driver on this machine";
    else if (status == cudaErrorInsufficientDriver)
      found.why_no_gpu = old_driver_message(found.driver_version, found.runtime_version);
    else if (status == cudaErrorNoDevice)
      found.why_no_gpu = "the CUDA driver reports no device";
    else
      found.why_no_gpu = std::string("CUDA unavailable: ") + cudaGetErrorName(status) + ": " +
                         cudaGetErrorString(status);
    return found;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    GpuInfo gpu{i, prop.name, prop.major, prop.minor, prop.multiProcessorCount, prop.totalGlobalMem,
                size_t(prop.l2CacheSize), choose_gpu_code(prop.major * 10 + prop.minor, this_build_gpu_code())};
    (gpu.code.usable() ? found.gpus : found.unusable).push_back(gpu);
  }
  if (found.gpus.empty()) found.why_no_gpu = found.unusable.empty() ? "the CUDA driver reports no usable device"
                                                                    : left_out(found);
#else
  found.why_no_gpu = "this is a CPU-only build (built without nvcc or with CUDA=0)";
#endif
  return found;
}

[[noreturn]] void bad_devices(const std::string& spec, const std::string& why) {
  throw Error("--devices " + spec + ": " + why +
              " (use auto, cpu, cpu:N, gpu, gpu:I,J,... or emu:I,J,...; see --list-devices)");
}

int parse_index(const std::string& spec, std::string_view text) {
  int value = -1;
  auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (err != std::errc() || end != text.data() + text.size() || value < 0)
    bad_devices(spec, "'" + std::string(text) + "' is not a non-negative integer");
  return value;
}

#if YOLO_EMULATED_KERNELS
// A size such as 512M, 2G or 1048576 (bytes; K, M, G are powers of 1024).
size_t parse_size(const std::string& spec, const std::string& text) {
  size_t value = 0;
  auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), value);
  std::string rest(end, text.data() + text.size());
  size_t scale = rest.empty() ? 1 : rest == "K" ? size_t(1) << 10 : rest == "M" ? size_t(1) << 20 : rest == "G" ? size_t(1) << 30 : 0;
  if (err != std::errc() || scale == 0 || value == 0 || value > (size_t(1) << 50) / scale)
    bad_devices(spec, "'" + text + "' is not a memory size (bytes, or a number with K, M or G)");
  return value * scale;
}
#endif

// emu:I[@prop]...,J...: emulated GPUs with their properties (device.h).
DeviceChoice choose_emulated(const std::string& spec, const std::string& list) {
#if YOLO_EMULATED_KERNELS
  DeviceChoice choice;
  std::stringstream items(list.empty() ? std::string("0") : list);
  for (std::string item; std::getline(items, item, ',');) {
    std::stringstream parts(item);
    std::string index_text;
    std::getline(parts, index_text, '@');
    int index = parse_index(spec, index_text);
    if (index >= emu::kMaxDevices)
      bad_devices(spec, "emu:" + index_text + " does not exist (emulated GPUs are emu:0.." +
                            std::to_string(emu::kMaxDevices - 1) + ")");
    for (const Device& d : choice.devices)
      if (d.index == index) bad_devices(spec, "emu:" + index_text + " is listed twice");
    emu::DeviceProps props = emu::preset_for(90);
    for (std::string prop; std::getline(parts, prop, '@');) {
      if (prop.size() >= 4 && prop.rfind("sm", 0) == 0 && std::isdigit(static_cast<unsigned char>(prop[2]))) {
        int cc = parse_index(spec, prop.substr(2));
        try {
          props = emu::preset_for(cc);
        } catch (const Error& e) {
          bad_devices(spec, e.what());
        }
      } else if (prop.rfind("sms=", 0) == 0) {
        props.multiprocessors = parse_index(spec, prop.substr(4));
        if (props.multiprocessors < 1 || props.multiprocessors > 1024) bad_devices(spec, "sms must be 1..1024");
      } else if (prop.rfind("mem=", 0) == 0) {
        props.memory_bytes = parse_size(spec, prop.substr(4));
      } else {
        bad_devices(spec, "unknown emulated GPU property '" + prop + "' (smXY, sms=N, mem=SIZE)");
      }
    }
    emu::configure_device(index, props);
    choice.devices.push_back(Device::emu(index));
  }
  choice.reason = "using " + std::to_string(choice.devices.size()) +
                  " emulated GPU(s) as requested: the CUDA kernels run on the CPU (slow; for tests and debugging)";
  return choice;
#else
  (void)list;
  bad_devices(spec, "emulated GPUs exist only in builds whose kernels are emulated (build/train_yolo_emu)");
#endif
}

}  // namespace

const GpuDiscovery& discover_gpus() {
  static const GpuDiscovery found = discover();
  return found;
}

DeviceChoice choose_devices(const std::string& spec, const GpuDiscovery& found) {
  DeviceChoice choice;
  if (spec == "auto" || spec.empty()) {
    if (found.gpus.empty()) {
      choice.devices = {Device::cpu()};
      choice.reason = "using the CPU backend: " + found.why_no_gpu;
    } else {
      for (const GpuInfo& g : found.gpus) choice.devices.push_back(Device::cuda(g.index));
      choice.reason = "using " + std::to_string(found.gpus.size()) + " GPU(s)";
      if (!found.unusable.empty()) choice.reason += " (" + left_out(found) + ")";
    }
    return choice;
  }
  std::string kind = spec.substr(0, spec.find(':'));
  std::string list = spec.find(':') == std::string::npos ? "" : spec.substr(spec.find(':') + 1);
  if (kind == "cpu") {
    int replicas = list.empty() ? 1 : parse_index(spec, list);
    if (replicas < 1 || replicas > 64) bad_devices(spec, "CPU replicas must be 1..64");
    choice.devices.assign(size_t(replicas), Device::cpu());
    choice.reason = "using the CPU backend as requested (" + std::to_string(replicas) + " replica(s))";
    return choice;
  }
  if (kind == "emu") return choose_emulated(spec, list);
  if (kind != "gpu") bad_devices(spec, "unknown device kind '" + kind + "'");
  if (found.gpus.empty()) bad_devices(spec, "no GPU is available: " + found.why_no_gpu);
  if (list.empty()) return choose_devices("auto", found);
  std::stringstream items(list);
  for (std::string item; std::getline(items, item, ',');) {
    int index = parse_index(spec, item);
    auto has_index = [index](const GpuInfo& g) { return g.index == index; };
    if (auto g = std::find_if(found.unusable.begin(), found.unusable.end(), has_index); g != found.unusable.end())
      bad_devices(spec, "GPU " + item + " (" + g->name + ") cannot run this build: " + g->code.why);
    if (std::none_of(found.gpus.begin(), found.gpus.end(), has_index))
      bad_devices(spec, "GPU " + item + " does not exist (found " +
                            std::to_string(found.gpus.size() + found.unusable.size()) + ")");
    for (const Device& d : choice.devices)
      if (d.index == index) bad_devices(spec, "GPU " + item + " is listed twice");
    choice.devices.push_back(Device::cuda(index));
  }
  choice.reason = "using " + std::to_string(choice.devices.size()) + " GPU(s) as requested";
  return choice;
}

std::string describe_devices(const GpuDiscovery& found) {
  std::ostringstream out;
  auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
  if (!found.cuda_built) {
    out << "CUDA: not in this build\n";
  } else {
    out << "CUDA: runtime " << version(found.runtime_version) << ", driver "
        << (found.driver_version ? version(found.driver_version) : std::string("none")) << "\n";
  }
  if (found.cuda_built) out << "Built for: " << describe_build_gpu_code(this_build_gpu_code()) << "\n";
  std::vector<GpuInfo> all = found.gpus;
  all.insert(all.end(), found.unusable.begin(), found.unusable.end());
  std::sort(all.begin(), all.end(), [](const GpuInfo& a, const GpuInfo& b) { return a.index < b.index; });
  if (all.empty())
    out << "GPUs: none (" << found.why_no_gpu << ")\n";
  else
    out << "GPUs: " << all.size() << (found.unusable.empty() ? "" : " (" + std::to_string(found.unusable.size()) + " unusable)")
        << "\n";
  for (const GpuInfo& g : all) {
    char line[256];
    std::snprintf(line, sizeof line, "  gpu:%d  %s  sm_%d%d  %d SMs  %.1f GiB  L2 %.0f MiB\n", g.index, g.name.c_str(),
                  g.cc_major, g.cc_minor, g.multiprocessors, double(g.memory_bytes) / (1u << 30),
                  double(g.l2_bytes) / (1u << 20));
    out << line << "    runs " << gpu_code_name(g.code.code) << ": " << g.code.why << "\n";
  }
  if (found.gpus.empty()) out << "  -> training runs on the CPU backend\n";
  const NcclStatusInfo& nccl = nccl_status();
  if (nccl.loaded)
    out << "NCCL: " << nccl.version / 10000 << "." << nccl.version / 100 % 100 << "." << nccl.version % 100
        << " (" << nccl.path << ")\n";
  else
    out << "NCCL: not loaded: " << nccl.why_not << "\n  -> multi-GPU data parallel is unavailable; one GPU or the CPU still work\n";
  out << "CPU: " << cpu_threads() << " hardware threads\n";
#if YOLO_EMULATED_KERNELS
  out << "Emulated GPUs: emu:0..emu:" << emu::kMaxDevices - 1
      << " (--devices emu:0,1; an H200-like sm_90 by default, emu:0@sm75@mem=2G for others): the CUDA kernels "
         "on the CPU, for tests and debugging, not for training\n";
#endif
  return out.str();
}

}  // namespace yolo
