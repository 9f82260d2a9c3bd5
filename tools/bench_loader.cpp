// bench_loader: images/s of the input pipeline (decode + augment + batch into pinned buffers)
// from 640x480 JPEGs, at 416 and 608, for 1..T loader threads; plus the single-thread split
// into decode and augment+render, so a slow loader says which stage binds (and what rounding the
// batch to 16 bits would add).
//   bench_loader [--images N] [--batch B] [--threads-max T] [--epochs E] [--dir DIR] [--keep]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "data/image.h"
#include "data/loader.h"
#include "data/synthetic.h"
#include "data/transform.h"
#include "kernels/half_types.h"
#include "runtime/check.h"

using namespace yolo;
using namespace yolo::data;
namespace fs = std::filesystem;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The cfg values of YOLOv3 ([net] hue .1, saturation 1.5, exposure 1.5; [yolo] jitter .3).
AugmentParams yolov3_augmentation() {
  AugmentParams p;
  p.jitter = 0.3f;
  p.hue = 0.1f;
  p.saturation = 1.5f;
  p.exposure = 1.5f;
  return p;
}

double loader_rate(const Split& split, int size, int threads, int batch, int epochs) {
  LoaderOptions o;
  o.batch = batch;
  o.net_w = o.net_h = size;
  o.augment = true;
  o.augment_params = yolov3_augmentation();
  o.threads = threads;
  o.prefetch = std::max(4, 2 * threads / batch + 2);
  o.remainder = Remainder::Wrap;
  Loader loader(split, o);
  loader.next();  // warm-up: threads started, pages of the pinned ring touched
  int64_t steps = loader.steps_per_epoch() * epochs;
  double t0 = now_s();
  for (int64_t s = 0; s < steps; ++s) loader.next();
  return static_cast<double>(steps) * batch / (now_s() - t0);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    int images = 96, batch = 16, epochs = 2;
    int threads_max = static_cast<int>(std::min(16u, std::max(1u, std::thread::hardware_concurrency())));
    std::string dir = (fs::temp_directory_path() / "yolo_bench_loader").string();
    bool keep = false;
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw Error(arg + " needs a value");
        return argv[++i];
      };
      if (arg == "--images") images = std::atoi(value().c_str());
      else if (arg == "--batch") batch = std::atoi(value().c_str());
      else if (arg == "--threads-max") threads_max = std::atoi(value().c_str());
      else if (arg == "--epochs") epochs = std::atoi(value().c_str());
      else if (arg == "--dir") dir = value();
      else if (arg == "--keep") keep = true;
      else throw Error("unknown option '" + arg + "' (try --images, --batch, --threads-max, --epochs, --dir, --keep)");
    }
    if (images < 1 || batch < 1 || threads_max < 1 || epochs < 1) throw Error("counts must be positive");

    SyntheticOptions so;
    so.train_images = images;
    so.valid_images = 1;
    so.width = 640;
    so.height = 480;
    SyntheticSet set = write_synthetic_dataset(dir, so);
    Split split;
    split.name = "train";
    split.samples = set.train;
    std::printf("bench_loader: %d JPEGs of 640x480 in %s, batch %d, YOLOv3 augmentation (jitter .3, hue .1, "
                "saturation 1.5, exposure 1.5), %u hardware threads\n",
                images, dir.c_str(), batch, std::thread::hardware_concurrency());

    // Single-thread stage split: decode, then augment + render at each size.
    Image image;
    std::string error;
    double t0 = now_s();
    for (const Sample& s : split.samples)
      if (!read_image(s.image, image, error)) throw Error(error);
    double decode_ms = (now_s() - t0) * 1e3 / images;
    std::printf("\n1 thread, per image: decode %.2f ms", decode_ms);
    for (int size : {416, 608}) {
      std::vector<float> out(static_cast<size_t>(size) * size * 3);
      std::vector<Box> boxes;
      double t1 = now_s();
      for (int i = 0; i < images; ++i) {
        KeyedRng rng(7, static_cast<uint64_t>(i));
        Augmentation aug = draw_augmentation(image.width, image.height, size, size, ResizeMode::Letterbox,
                                             yolov3_augmentation(), rng);
        render_input(image, aug.placement, aug.color, out.data());
        boxes.clear();
        transform_boxes(split.samples[i].boxes, aug.placement, 2, boxes);
      }
      std::printf(", augment+render at %d %.2f ms", size, (now_s() - t1) * 1e3 / images);
    }
    // What handing the batch over in 16 bits would add per image (docs/perf.md, 2026-12-05: tried,
    // reverted: the loader binds first at 8 GPUs, and the copy is hidden under the step).
    {
      std::vector<float> rendered(size_t(416) * 416 * 3);
      for (size_t i = 0; i < rendered.size(); ++i) rendered[i] = static_cast<float>(i % 1021) / 1021.0f;
      std::vector<Bf16> b(rendered.size());
      std::vector<Fp16> h(rendered.size());
      const int reps = 20;
      double t1 = now_s();
      for (int r = 0; r < reps; ++r)
        for (size_t i = 0; i < rendered.size(); ++i) b[i] = to_bf16(rendered[i]);
      double t2 = now_s();
      for (int r = 0; r < reps; ++r)
        for (size_t i = 0; i < rendered.size(); ++i) h[i] = to_fp16(rendered[i]);
      double t3 = now_s();
      std::printf(", rounding to bf16 at 416 %.2f ms (fp16 %.2f ms; check %u)", (t2 - t1) * 1e3 / reps,
                  (t3 - t2) * 1e3 / reps, unsigned(b[7].bits ^ h[7].bits));
    }
    std::printf("\n\n%8s %14s %14s %12s\n", "threads", "img/s @416", "img/s @608", "per thread@416");
    std::vector<int> counts;
    for (int t : {1, 2, 3, 4, 6, 8, 12, 16})
      if (t < threads_max) counts.push_back(t);
    counts.push_back(threads_max);
    for (int threads : counts) {
      double r416 = loader_rate(split, 416, threads, batch, epochs);
      double r608 = loader_rate(split, 608, threads, batch, epochs);
      std::printf("%8d %14.1f %14.1f %12.1f\n", threads, r416, r608, r416 / threads);
      std::fflush(stdout);
    }
    if (!keep) fs::remove_all(dir);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_loader: error: %s\n", e.what());
    return 2;
  }
}
