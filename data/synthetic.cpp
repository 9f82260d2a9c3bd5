// The synthetic shapes dataset: drawing one image as a pure function of (seed, index), and
// writing a whole train/validation set with labels in the darknet, YOLO, VOC and COCO formats.
#include "data/synthetic.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <span>
#include <thread>

#include "data/rng.h"
#include "runtime/check.h"

namespace yolo::data {
namespace {

namespace fs = std::filesystem;

// Inclusive pixel columns c0..c1 and rows r0..r1.
struct PixelBox {
  int c0, r0, c1, r1;
  int64_t area() const { return int64_t(c1 - c0 + 1) * (r1 - r0 + 1); }
};

struct DrawnShape {
  int class_id;
  PixelBox box;  // tight around the pixels painted for it
};

struct Span {
  int row, c0, c1;
};

// Validation images come from a distant part of the (seed, index) stream, so they never repeat
// a training image whatever the counts.
constexpr int64_t kValidIndexOffset = int64_t(1) << 40;
constexpr int kMaxSide = 32768;

// The background stays within this many levels of its base colour (gradient + noise), and a
// shape's colour differs from the base by at least kMinContrast in some channel, so no
// background pixel ever has a shape's exact colour.
constexpr float kGradient = 25.0f;  // full swing across the image, per channel
constexpr int kNoise = 10;
constexpr int kMinContrast = 100;

// Area of `target` covered by the union of `covers` (coordinate compression: few boxes).
int64_t covered_area(const PixelBox& target, const std::vector<PixelBox>& covers) {
  std::vector<int> xs = {target.c0, target.c1 + 1}, ys = {target.r0, target.r1 + 1};
  for (const PixelBox& b : covers) {
    xs.push_back(std::clamp(b.c0, target.c0, target.c1 + 1));
    xs.push_back(std::clamp(b.c1 + 1, target.c0, target.c1 + 1));
    ys.push_back(std::clamp(b.r0, target.r0, target.r1 + 1));
    ys.push_back(std::clamp(b.r1 + 1, target.r0, target.r1 + 1));
  }
  std::sort(xs.begin(), xs.end());
  xs.erase(std::unique(xs.begin(), xs.end()), xs.end());
  std::sort(ys.begin(), ys.end());
  ys.erase(std::unique(ys.begin(), ys.end()), ys.end());
  int64_t area = 0;
  for (size_t i = 0; i + 1 < xs.size(); ++i)
    for (size_t j = 0; j + 1 < ys.size(); ++j) {
      bool covered = std::any_of(covers.begin(), covers.end(), [&](const PixelBox& b) {
        return xs[i] >= b.c0 && xs[i] <= b.c1 && ys[j] >= b.r0 && ys[j] <= b.r1;
      });
      if (covered) area += int64_t(xs[i + 1] - xs[i]) * (ys[j + 1] - ys[j]);
    }
  return area;
}

// A saturated colour from hue/saturation/value.
void hsv_colour(float hue, float saturation, float value, uint8_t rgb[3]) {
  float h = hue * 6.0f;
  int sector = std::min(int(h), 5);
  float f = h - float(sector);
  float p = value * (1 - saturation), q = value * (1 - saturation * f), t = value * (1 - saturation * (1 - f));
  float channels[6][3] = {{value, t, p}, {q, value, p}, {p, value, t}, {p, q, value}, {t, p, value}, {value, p, q}};
  for (int c = 0; c < 3; ++c) rgb[c] = uint8_t(std::lround(channels[sector][c] * 255.0f));
}

void pick_shape_colour(KeyedRng& rng, const int base[3], uint8_t rgb[3]) {
  for (int attempt = 0; attempt < 16; ++attempt) {
    hsv_colour(rng.unit(), rng.uniform(0.65f, 1.0f), rng.uniform(0.6f, 1.0f), rgb);
    int contrast = 0;
    for (int c = 0; c < 3; ++c) contrast = std::max(contrast, std::abs(int(rgb[c]) - base[c]));
    if (contrast >= kMinContrast) return;
  }
  for (int c = 0; c < 3; ++c) rgb[c] = base[c] < 128 ? 255 : 0;  // the far corner of the cube
}

void draw_background(KeyedRng& rng, Image& image, int base[3]) {
  float gx[3], gy[3];
  for (int c = 0; c < 3; ++c) {
    base[c] = 30 + int(rng.below(196));
    gx[c] = rng.uniform(-kGradient, kGradient);
    gy[c] = rng.uniform(-kGradient, kGradient);
  }
  const int width = image.width, height = image.height;
  uint64_t bits = 0;
  int bits_left = 0;
  for (int y = 0; y < height; ++y) {
    float fy = (y + 0.5f) / float(height) - 0.5f;
    uint8_t* row = image.pixel(0, y);
    for (int x = 0; x < width; ++x) {
      float fx = (x + 0.5f) / float(width) - 0.5f;
      for (int c = 0; c < 3; ++c) {
        if (bits_left == 0) {
          bits = rng.next();
          bits_left = 8;
        }
        int noise = int(bits & 0xFF) % (2 * kNoise + 1) - kNoise;
        bits >>= 8;
        --bits_left;
        int v = base[c] + int(std::lround(gx[c] * fx + gy[c] * fy)) + noise;
        row[x * 3 + c] = uint8_t(std::clamp(v, 0, 255));
      }
    }
  }
}

// The pixels (by centre) of a shape of `class_id` inside the planned box; shapes are convex,
// so each row is one span. Triangles: apex on one side of the box, base along the opposite.
std::vector<Span> rasterise(int class_id, int x0, int y0, int bw, int bh, KeyedRng& rng) {
  float ax = 0, ay = 0, bx = 0, by = 0, cx = 0, cy = 0;
  if (class_id == 2) {
    float t = rng.unit(), left = float(x0), right = float(x0 + bw), top = float(y0), bottom = float(y0 + bh);
    switch (rng.below(4)) {
      case 0: ax = left + t * bw, ay = top, bx = left, by = bottom, cx = right, cy = bottom; break;
      case 1: ax = left + t * bw, ay = bottom, bx = left, by = top, cx = right, cy = top; break;
      case 2: ax = left, ay = top + t * bh, bx = right, by = top, cx = right, cy = bottom; break;
      default: ax = right, ay = top + t * bh, bx = left, by = top, cx = left, cy = bottom; break;
    }
  }
  auto edge = [](float px, float py, float qx, float qy, float x, float y) { return (qx - px) * (y - py) - (qy - py) * (x - px); };
  float orientation = edge(ax, ay, bx, by, cx, cy);
  auto inside = [&](int col, int row) {
    float x = col + 0.5f, y = row + 0.5f;
    if (class_id == 0) return true;
    if (class_id == 1) {
      float dx = (x - (x0 + bw * 0.5f)) / (bw * 0.5f), dy = (y - (y0 + bh * 0.5f)) / (bh * 0.5f);
      return dx * dx + dy * dy <= 1.0f;
    }
    float e0 = edge(ax, ay, bx, by, x, y), e1 = edge(bx, by, cx, cy, x, y), e2 = edge(cx, cy, ax, ay, x, y);
    return orientation > 0 ? (e0 >= 0 && e1 >= 0 && e2 >= 0) : (e0 <= 0 && e1 <= 0 && e2 <= 0);
  };
  std::vector<Span> spans;
  for (int row = y0; row < y0 + bh; ++row) {
    int first = x0;
    while (first < x0 + bw && !inside(first, row)) ++first;
    if (first == x0 + bw) continue;
    int last = x0 + bw - 1;
    while (!inside(last, row)) --last;
    spans.push_back({row, first, last});
  }
  return spans;
}

void check_options(int width, int height, int min_shapes, int max_shapes) {
  if (width < 16 || height < 16 || width > kMaxSide || height > kMaxSide)
    throw Error("synthetic images must be 16.." + std::to_string(kMaxSide) + " pixels per side, got " +
                std::to_string(width) + "x" + std::to_string(height));
  if (min_shapes < 0 || max_shapes < min_shapes || max_shapes > kMaxBoxes)
    throw Error("synthetic shapes per image must satisfy 0 <= min (" + std::to_string(min_shapes) + ") <= max (" +
                std::to_string(max_shapes) + ") <= " + std::to_string(kMaxBoxes));
}

std::vector<DrawnShape> draw_shapes(uint64_t seed, int64_t index, int width, int height, int min_shapes,
                                    int max_shapes, Image& image) {
  check_options(width, height, min_shapes, max_shapes);
  KeyedRng rng(seed, uint64_t(index));
  image.width = width;
  image.height = height;
  image.rgb.resize(size_t(width) * height * 3);
  int base[3];
  draw_background(rng, image, base);

  int count = min_shapes + int(rng.below(uint64_t(max_shapes - min_shapes + 1)));
  std::vector<DrawnShape> shapes;
  for (int s = 0; s < count; ++s) {
    int class_id = int(rng.below(3));
    uint8_t colour[3];
    pick_shape_colour(rng, base, colour);
    // A few placements; if each would bury an earlier shape, this one is left out.
    for (int attempt = 0; attempt < 8; ++attempt) {
      // Sides log-uniform in 6%..45% of the image side, aspect ratio up to 2:1 either way.
      float side = 0.06f * std::pow(0.45f / 0.06f, rng.unit());
      float aspect = std::pow(2.0f, rng.uniform(-1.0f, 1.0f));
      int bw = std::max(3, int(width * std::clamp(side * std::sqrt(aspect), 0.06f, 0.45f)));
      int bh = std::max(3, int(height * std::clamp(side / std::sqrt(aspect), 0.06f, 0.45f)));
      int x0 = int(rng.below(uint64_t(width - bw + 1))), y0 = int(rng.below(uint64_t(height - bh + 1)));
      std::vector<Span> spans = rasterise(class_id, x0, y0, bw, bh, rng);
      if (spans.empty()) continue;
      PixelBox box{width, spans.front().row, -1, spans.back().row};
      for (const Span& span : spans) {
        box.c0 = std::min(box.c0, span.c0);
        box.c1 = std::max(box.c1, span.c1);
      }
      // No earlier shape's box may end up more than half covered by the boxes drawn after it.
      bool buries = false;
      for (size_t i = 0; i < shapes.size() && !buries; ++i) {
        std::vector<PixelBox> later = {box};
        for (size_t j = i + 1; j < shapes.size(); ++j) later.push_back(shapes[j].box);
        buries = 2 * covered_area(shapes[i].box, later) > shapes[i].box.area();
      }
      if (buries) continue;
      for (const Span& span : spans)
        for (int col = span.c0; col <= span.c1; ++col) std::memcpy(image.pixel(col, span.row), colour, 3);
      shapes.push_back({class_id, box});
      break;
    }
  }
  return shapes;
}

Box normalised(const DrawnShape& shape, int width, int height) {
  const PixelBox& b = shape.box;
  Box box;
  box.x = float((b.c0 + b.c1 + 1) / 2.0 / width);
  box.y = float((b.r0 + b.r1 + 1) / 2.0 / height);
  box.w = float((b.c1 - b.c0 + 1) / double(width));
  box.h = float((b.r1 - b.r0 + 1) / double(height));
  box.class_id = shape.class_id;
  return box;
}

void write_text(const fs::path& path, const std::string& text) {
  errno = 0;
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (!file) throw Error("cannot write " + path.string() + ": " + std::strerror(errno));
  bool ok = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  int saved_errno = errno;
  if (std::fclose(file) != 0 && ok) {
    ok = false;
    saved_errno = errno;
  }
  if (!ok) throw Error("cannot write " + path.string() + ": " + std::strerror(saved_errno));
}

void make_dirs(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error("cannot create directory " + dir.string() + ": " + ec.message());
}

std::string format(const char* pattern, auto... values) {
  int n = std::snprintf(nullptr, 0, pattern, values...);
  std::string text(size_t(std::max(n, 0)), '\0');
  std::snprintf(text.data(), text.size() + 1, pattern, values...);
  return text;
}

// Printed from the exact (double) values, so a reader gets them to 1e-6 rather than a float's
// rounding printed again.
std::string yolo_labels(const std::vector<DrawnShape>& shapes, int width, int height) {
  std::string text;
  for (const DrawnShape& s : shapes) {
    const PixelBox& b = s.box;
    text += format("%d %.6f %.6f %.6f %.6f\n", s.class_id, (b.c0 + b.c1 + 1) / 2.0 / width,
                   (b.r0 + b.r1 + 1) / 2.0 / height, (b.c1 - b.c0 + 1) / double(width),
                   (b.r1 - b.r0 + 1) / double(height));
  }
  return text;
}

std::string voc_xml(const std::string& file_name, const std::vector<DrawnShape>& shapes, int width, int height) {
  std::string xml = "<annotation>\n  <folder>images</folder>\n  <filename>" + file_name + "</filename>\n";
  xml += format("  <size>\n    <width>%d</width>\n    <height>%d</height>\n    <depth>3</depth>\n  </size>\n", width, height);
  for (const DrawnShape& s : shapes) {
    xml += "  <object>\n    <name>" + synthetic_class_names()[size_t(s.class_id)] + "</name>\n";
    xml += "    <pose>Unspecified</pose>\n    <truncated>0</truncated>\n    <difficult>0</difficult>\n";
    // VOC corners are 1-based and inclusive.
    xml += format("    <bndbox>\n      <xmin>%d</xmin>\n      <ymin>%d</ymin>\n      <xmax>%d</xmax>\n      <ymax>%d</ymax>\n    </bndbox>\n",
                  s.box.c0 + 1, s.box.r0 + 1, s.box.c1 + 1, s.box.r1 + 1);
    xml += "  </object>\n";
  }
  return xml + "</annotation>\n";
}

struct DrawnImage {
  std::string file_name;  // "000000.jpg"
  std::vector<DrawnShape> shapes;
};

std::string coco_json(std::span<const DrawnImage> images, int width, int height) {
  std::string json = "{\n\"images\": [";
  for (size_t i = 0; i < images.size(); ++i)
    json += format("%s\n  {\"id\": %zu, \"file_name\": \"%s\", \"width\": %d, \"height\": %d}", i ? "," : "", i + 1,
                   images[i].file_name.c_str(), width, height);
  json += "\n],\n\"annotations\": [";
  size_t annotation_id = 0;
  for (size_t i = 0; i < images.size(); ++i)
    for (const DrawnShape& s : images[i].shapes) {
      int w = s.box.c1 - s.box.c0 + 1, h = s.box.r1 - s.box.r0 + 1;
      json += format("%s\n  {\"id\": %zu, \"image_id\": %zu, \"category_id\": %d, \"bbox\": [%d, %d, %d, %d], "
                     "\"area\": %d, \"iscrowd\": 0}",
                     annotation_id ? "," : "", annotation_id + 1, i + 1, s.class_id + 1, s.box.c0, s.box.r0, w, h, w * h);
      ++annotation_id;
    }
  json += "\n],\n\"categories\": [";
  const auto& names = synthetic_class_names();
  for (size_t c = 0; c < names.size(); ++c)
    json += format("%s\n  {\"id\": %zu, \"name\": \"%s\"}", c ? "," : "", c + 1, names[c].c_str());
  return json + "\n]\n}\n";
}

}  // namespace

const std::vector<std::string>& synthetic_class_names() {
  static const std::vector<std::string> names = {"rectangle", "ellipse", "triangle"};
  return names;
}

void draw_synthetic_image(uint64_t seed, int64_t index, int width, int height, int min_shapes, int max_shapes,
                          Image& image, std::vector<Box>& boxes) {
  std::vector<DrawnShape> shapes = draw_shapes(seed, index, width, height, min_shapes, max_shapes, image);
  boxes.clear();
  for (const DrawnShape& shape : shapes) boxes.push_back(normalised(shape, width, height));
}

SyntheticSet write_synthetic_dataset(const std::string& root, const SyntheticOptions& options) {
  if (options.train_images < 0 || options.valid_images < 0)
    throw Error("synthetic dataset " + root + ": image counts must not be negative");
  check_options(options.width, options.height, options.min_shapes, options.max_shapes);
  const fs::path base(root);
  const char* split_dirs[2] = {"train", "validation"};
  for (const char* split : split_dirs)
    for (const char* part : {"images", "labels", "annotations"}) make_dirs(base / split / part);
  make_dirs(base / "annotations");
  make_dirs(base / "backup");

  SyntheticSet set;
  set.root = root;
  set.data_file = (base / "shapes.data").string();
  set.names_file = (base / "shapes.names").string();
  std::string names;
  for (const std::string& name : synthetic_class_names()) names += name + "\n";
  write_text(set.names_file, names);
  write_text(set.data_file, "classes=3\ntrain=train.txt\nvalid=valid.txt\nnames=shapes.names\nbackup=backup/\n");

  // One job per image, handed out to worker threads; results land in fixed slots, so the
  // output does not depend on which thread drew what.
  const int counts[2] = {options.train_images, options.valid_images};
  const int64_t total = int64_t(counts[0]) + counts[1];
  std::vector<DrawnImage> drawn(static_cast<size_t>(total));
  std::vector<Sample> samples(static_cast<size_t>(total));
  const char* extension = options.png ? ".png" : ".jpg";
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr first_error;
  std::mutex error_mutex;
  auto worker = [&] {
    Image image;
    while (!failed) {
      int64_t job = next++;
      if (job >= total) return;
      try {
        int split = job < counts[0] ? 0 : 1;
        int64_t i = split == 0 ? job : job - counts[0];
        int64_t stream_index = split == 0 ? i : kValidIndexOffset + i;
        DrawnImage& out = drawn[size_t(job)];
        out.shapes = draw_shapes(options.seed, stream_index, options.width, options.height, options.min_shapes,
                                 options.max_shapes, image);
        std::string stem = format("%06lld", static_cast<long long>(i));
        out.file_name = stem + extension;
        fs::path dir = base / split_dirs[split];
        fs::path image_path = dir / "images" / out.file_name;
        write_image(image_path.string(), image, 90);
        write_text(dir / "labels" / (stem + ".txt"), yolo_labels(out.shapes, options.width, options.height));
        write_text(dir / "annotations" / (stem + ".xml"), voc_xml(out.file_name, out.shapes, options.width, options.height));
        Sample& sample = samples[size_t(job)];
        sample.image = image_path.string();
        for (const DrawnShape& shape : out.shapes) sample.boxes.push_back(normalised(shape, options.width, options.height));
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
        failed = true;
      }
    }
  };
  int thread_count = int(std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, std::max<int64_t>(total, 1)));
  std::vector<std::thread> threads;
  for (int t = 1; t < thread_count; ++t) threads.emplace_back(worker);
  worker();
  for (auto& thread : threads) thread.join();
  if (first_error) std::rethrow_exception(first_error);

  std::string lists[2];
  for (int64_t job = 0; job < total; ++job) {
    int split = job < counts[0] ? 0 : 1;
    lists[split] += std::string(split_dirs[split]) + "/images/" + drawn[size_t(job)].file_name + "\n";
  }
  write_text(base / "train.txt", lists[0]);
  write_text(base / "valid.txt", lists[1]);
  std::span<const DrawnImage> all(drawn);
  write_text(base / "annotations" / "instances_train.json",
             coco_json(all.first(size_t(counts[0])), options.width, options.height));
  write_text(base / "annotations" / "instances_validation.json",
             coco_json(all.subspan(size_t(counts[0])), options.width, options.height));
  set.train.assign(std::make_move_iterator(samples.begin()), std::make_move_iterator(samples.begin() + counts[0]));
  set.valid.assign(std::make_move_iterator(samples.begin() + counts[0]), std::make_move_iterator(samples.end()));
  return set;
}

}  // namespace yolo::data
