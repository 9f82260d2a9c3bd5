// Letterbox/stretch placement, augmentation draws, the bilinear + HSV render of the network
// input and the matching box transform (see transform.h).
#include "data/transform.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <optional>

#include "runtime/check.h"

namespace yolo::data {

const char* resize_mode_name(ResizeMode mode) { return mode == ResizeMode::Letterbox ? "letterbox" : "stretch"; }

ResizeMode parse_resize_mode(const std::string& s) {
  if (s == "letterbox") return ResizeMode::Letterbox;
  if (s == "stretch") return ResizeMode::Stretch;
  throw Error("unknown resize mode '" + s + "': the choices are letterbox, stretch");
}

// In double, so a round trip through the network and back loses only the final float rounding.
Box Placement::to_network(const Box& box) const {
  double x = static_cast<double>(box.x) * image_w * scale_x + offset_x;
  if (flip) x = net_w - x;
  double y = static_cast<double>(box.y) * image_h * scale_y + offset_y;
  Box out = box;
  out.x = static_cast<float>(x / net_w);
  out.y = static_cast<float>(y / net_h);
  out.w = static_cast<float>(static_cast<double>(box.w) * image_w * scale_x / net_w);
  out.h = static_cast<float>(static_cast<double>(box.h) * image_h * scale_y / net_h);
  return out;
}

Box Placement::to_image(const Box& box) const {
  double x = static_cast<double>(box.x) * net_w;
  if (flip) x = net_w - x;
  double y = static_cast<double>(box.y) * net_h;
  Box out = box;
  out.x = static_cast<float>((x - offset_x) / scale_x / image_w);
  out.y = static_cast<float>((y - offset_y) / scale_y / image_h);
  out.w = static_cast<float>(static_cast<double>(box.w) * net_w / scale_x / image_w);
  out.h = static_cast<float>(static_cast<double>(box.h) * net_h / scale_y / image_h);
  return out;
}

namespace {

void check_sizes(const char* what, int image_w, int image_h, int net_w, int net_h) {
  if (image_w <= 0 || image_h <= 0 || net_w <= 0 || net_h <= 0)
    throw Error(std::string(what) + ": image " + std::to_string(image_w) + "x" + std::to_string(image_h) +
                " and network " + std::to_string(net_w) + "x" + std::to_string(net_h) + " must all be positive");
}

// Fits the image window [left, left + crop_w) x [top, top + crop_h) (image pixels) into the
// network. fit_placement is the whole image (left = top = 0), so jitter 0 reproduces it exactly.
Placement fit_window(int image_w, int image_h, int net_w, int net_h, ResizeMode mode, float left, float top,
                     float crop_w, float crop_h) {
  Placement p;
  p.image_w = image_w;
  p.image_h = image_h;
  p.net_w = net_w;
  p.net_h = net_h;
  p.scale_x = net_w / crop_w;
  p.scale_y = net_h / crop_h;
  float bar_x = 0, bar_y = 0;
  if (mode == ResizeMode::Letterbox) {
    float scale = std::min(p.scale_x, p.scale_y);
    p.scale_x = p.scale_y = scale;
    bar_x = (net_w - crop_w * scale) / 2;
    bar_y = (net_h - crop_h * scale) / 2;
  }
  p.offset_x = bar_x - p.scale_x * left;
  p.offset_y = bar_y - p.scale_y * top;
  return p;
}

// A crop edge pair [lo, hi) on an axis of `size` pixels, widened about its centre to at least
// 10% of the axis (large jitter can make the edges cross).
void clamp_window(float& lo, float& hi, int size) {
  float min_extent = 0.1f * size;
  if (hi - lo < min_extent) {
    float centre = (lo + hi) / 2;
    lo = centre - min_extent / 2;
    hi = centre + min_extent / 2;
  }
}

// A saturation/exposure factor: uniform in [1, s] (s < 1 read as 1/s), inverted on a coin.
// Draws exactly two values whatever `s` is.
float draw_scale_factor(float s, KeyedRng& rng) {
  float top = s < 1 ? 1 / s : s;
  float factor = rng.uniform(1, top);
  return rng.coin() ? 1 / factor : factor;
}

// Bounds wide enough for any sensible cfg, narrow enough that no draw overflows to inf or NaN.
void check_param(const char* name, float value, float lo, float hi) {
  if (!(value >= lo && value <= hi))
    throw Error(std::string("augmentation ") + name + " = " + std::to_string(value) + " is out of range [" +
                std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

}  // namespace

Placement fit_placement(int image_w, int image_h, int net_w, int net_h, ResizeMode mode) {
  check_sizes("fit_placement", image_w, image_h, net_w, net_h);
  return fit_window(image_w, image_h, net_w, net_h, mode, 0, 0, static_cast<float>(image_w),
                    static_cast<float>(image_h));
}

Augmentation draw_augmentation(int image_w, int image_h, int net_w, int net_h, ResizeMode mode,
                               const AugmentParams& params, KeyedRng& rng) {
  check_sizes("draw_augmentation", image_w, image_h, net_w, net_h);
  check_param("jitter", params.jitter, 0, 10);
  check_param("hue", params.hue, 0, 1);
  check_param("saturation", params.saturation, 0.01f, 100);
  check_param("exposure", params.exposure, 0.01f, 100);

  // Edge moves: positive cuts into the image, negative extends past it (filled with grey).
  float jx = params.jitter * image_w, jy = params.jitter * image_h;
  float cut_left = rng.uniform(-jx, jx);
  float cut_right = rng.uniform(-jx, jx);
  float cut_top = rng.uniform(-jy, jy);
  float cut_bottom = rng.uniform(-jy, jy);
  float left = cut_left, right = image_w - cut_right;
  float top = cut_top, bottom = image_h - cut_bottom;
  clamp_window(left, right, image_w);
  clamp_window(top, bottom, image_h);

  Augmentation a;
  a.placement = fit_window(image_w, image_h, net_w, net_h, mode, left, top, right - left, bottom - top);
  bool flip_coin = rng.coin();
  a.placement.flip = params.flip && flip_coin;
  a.color.hue = rng.uniform(-params.hue, params.hue);
  a.color.saturation = draw_scale_factor(params.saturation, rng);
  a.color.exposure = draw_scale_factor(params.exposure, rng);
  return a;
}

namespace {

// Where one output column (or row) samples the image: byte offsets of its two bilinear taps
// (already clamped to the edge) and their weights.
struct Tap {
  size_t first = 0, second = 0;
  float w_first = 0, w_second = 0;
};

// Taps for the network pixels 0..net-1 along one axis; [inside_lo, inside_hi) are those whose
// centre falls inside the image (an interval, since the mapping is monotonic).
struct AxisTaps {
  std::vector<Tap> taps;
  int inside_lo = 0, inside_hi = 0;
};

AxisTaps axis_taps(int net, int size, float scale, float offset, bool flip, size_t stride) {
  AxisTaps axis;
  axis.taps.resize(net);
  axis.inside_lo = net;
  for (int u = 0; u < net; ++u) {
    int source = flip ? net - 1 - u : u;
    // In double so the inside test is exact enough not to depend on rounding near the edges.
    double x = (source + 0.5 - static_cast<double>(offset)) / static_cast<double>(scale);
    if (!(x >= 0 && x < size)) continue;
    axis.inside_lo = std::min(axis.inside_lo, u);
    axis.inside_hi = u + 1;
    double centre = x - 0.5;  // sample positions relative to pixel centres
    double lower = std::floor(centre);
    float frac = static_cast<float>(centre - lower);
    int i0 = static_cast<int>(lower);
    Tap& t = axis.taps[u];
    t.first = static_cast<size_t>(std::clamp(i0, 0, size - 1)) * stride;
    t.second = static_cast<size_t>(std::clamp(i0 + 1, 0, size - 1)) * stride;
    t.w_first = 1 - frac;
    t.w_second = frac;
  }
  if (axis.inside_hi == 0) axis.inside_lo = 0;
  return axis;
}

// Bytes as floats in [0, 1]: a table lookup is cheaper than converting in the inner loop.
constexpr std::array<float, 256> kByteToUnit = [] {
  std::array<float, 256> table{};
  for (int i = 0; i < 256; ++i) table[i] = i / 255.0f;
  return table;
}();

// Four floats as one value (GCC/Clang vector extension: SSE2 on x86-64, NEON on ARM), so the
// HSV pass handles four pixels per step with selects instead of branches.
using Lanes = float __attribute__((vector_size(16)));
constexpr int kLanes = 4;

Lanes lanes_of(float x) { return Lanes{x, x, x, x}; }
Lanes min_lanes(Lanes a, Lanes b) { return a < b ? a : b; }
Lanes max_lanes(Lanes a, Lanes b) { return a > b ? a : b; }

// The colour shift on channel planes of one row: RGB -> HSV, hue turned (in sixths of the
// circle, wrapping), saturation and value scaled and clamped, back to RGB.
class ColorShifter {
 public:
  ColorShifter(const ColorShift& color, int width)
      : padded_((width + kLanes - 1) / kLanes * kLanes), planes_(3 * static_cast<size_t>(padded_), 0.0f) {
    float turn = color.hue - std::floor(color.hue);
    if (turn >= 1) turn = 0;  // a tiny negative hue rounds up to a full turn
    hue6_ = lanes_of(turn * 6);
    sat_ = lanes_of(color.saturation);
    expo_ = lanes_of(color.exposure);
  }

  // Channel planes of one row (padded to whole lanes) for the caller to fill.
  float* red() { return planes_.data(); }
  float* green() { return planes_.data() + padded_; }
  float* blue() { return planes_.data() + 2 * static_cast<size_t>(padded_); }

  // Shifts the planes and writes them interleaved to `rgb`.
  void apply(float* rgb, int width) {
    float *r = red(), *g = green(), *b = blue();
    for (int i = 0; i < width; i += kLanes) shift(r + i, g + i, b + i);
    for (int i = 0; i < width; ++i) {
      rgb[3 * i] = r[i];
      rgb[3 * i + 1] = g[i];
      rgb[3 * i + 2] = b[i];
    }
  }

 private:
  void shift(float* rp, float* gp, float* bp) const {
    const Lanes zero = lanes_of(0), one = lanes_of(1), six = lanes_of(6);
    Lanes r, g, b;
    std::memcpy(&r, rp, sizeof r);
    std::memcpy(&g, gp, sizeof g);
    std::memcpy(&b, bp, sizeof b);
    Lanes mx = max_lanes(r, max_lanes(g, b));
    Lanes d = mx - min_lanes(r, min_lanes(g, b));
    // One division gives both 1/d and 1/mx. Grey lanes (d about 0, where d * mx could
    // underflow) divide by 1 instead: their saturation comes out 0, so their hue does not matter.
    auto coloured = d > lanes_of(1e-12f);
    Lanes inv = one / (coloured ? d * mx : one);
    Lanes inv_d = mx * inv;
    Lanes h = mx == r ? (g - b) * inv_d : mx == g ? (b - r) * inv_d + 2 * one : (r - g) * inv_d + 4 * one;
    h += h < zero ? six : zero;
    h += hue6_;
    h -= h >= six ? six : zero;
    Lanes s = min_lanes(d * (d * inv) * sat_, one);
    Lanes v = min_lanes(mx * expo_, one);
    Lanes c = v * s;
    // Channel n in {5, 3, 1} (R, G, B) is v - c * clamp(min(k, 4 - k), 0, 1), k = (n + h) mod 6.
    auto channel = [&](float n) {
      Lanes k = h + lanes_of(n);
      k -= k >= six ? six : zero;
      Lanes t = min_lanes(k, 4 * one - k);
      t = min_lanes(max_lanes(t, zero), one);
      return v - c * t;
    };
    r = channel(5);
    g = channel(3);
    b = channel(1);
    std::memcpy(rp, &r, sizeof r);
    std::memcpy(gp, &g, sizeof g);
    std::memcpy(bp, &b, sizeof b);
  }

  int padded_;
  std::vector<float> planes_;  // R, G, B planes of one row, padded to whole lanes
  Lanes hue6_, sat_, expo_;
};

}  // namespace

void render_input(const Image& image, const Placement& placement, const ColorShift& color, float* out) {
  const Placement& p = placement;
  if (p.image_w != image.width || p.image_h != image.height)
    throw Error("render_input: placement is for a " + std::to_string(p.image_w) + "x" + std::to_string(p.image_h) +
                " image but the image is " + std::to_string(image.width) + "x" + std::to_string(image.height));
  check_sizes("render_input", image.width, image.height, p.net_w, p.net_h);
  if (image.rgb.size() != static_cast<size_t>(image.width) * image.height * 3)
    throw Error("render_input: image holds " + std::to_string(image.rgb.size()) + " bytes, not width*height*3");
  if (!(p.scale_x > 0 && p.scale_y > 0 && std::isfinite(p.scale_x) && std::isfinite(p.scale_y) &&
        std::isfinite(p.offset_x) && std::isfinite(p.offset_y)))
    throw Error("render_input: placement scales must be positive and finite, offsets finite");
  if (!(std::isfinite(color.hue) && color.saturation >= 0 && color.exposure >= 0 &&
        std::isfinite(color.saturation) && std::isfinite(color.exposure)))
    throw Error("render_input: colour shift must be finite with non-negative saturation and exposure");

  const int nw = p.net_w, nh = p.net_h;
  const size_t row_floats = static_cast<size_t>(nw) * 3;
  AxisTaps cols = axis_taps(nw, image.width, p.scale_x, p.offset_x, p.flip, 3);
  AxisTaps rows = axis_taps(nh, image.height, p.scale_y, p.offset_y, false, static_cast<size_t>(image.width) * 3);
  const uint8_t* src = image.rgb.data();
  const float* unit = kByteToUnit.data();
  std::optional<ColorShifter> shifter;
  if (!color.identity()) shifter.emplace(color, nw);

  for (int v = 0; v < nh; ++v) {
    float* row = out + v * row_floats;
    // Each pixel goes straight to the colour shifter's planes when there is a shift.
    float *red = row, *green = row + 1, *blue = row + 2;
    size_t step = 3;
    if (shifter) {
      red = shifter->red();
      green = shifter->green();
      blue = shifter->blue();
      step = 1;
    }
    auto put_grey = [&](int from, int to) {
      for (int u = from; u < to; ++u) red[u * step] = green[u * step] = blue[u * step] = 0.5f;
    };
    if (v < rows.inside_lo || v >= rows.inside_hi) {
      put_grey(0, nw);
    } else {
      const Tap& ty = rows.taps[v];
      const uint8_t* upper = src + ty.first;
      const uint8_t* lower = src + ty.second;
      const float wy0 = ty.w_first, wy1 = ty.w_second;
      put_grey(0, cols.inside_lo);
      for (int u = cols.inside_lo; u < cols.inside_hi; ++u) {
        const Tap& tx = cols.taps[u];
        const float w00 = tx.w_first * wy0, w01 = tx.w_second * wy0;
        const float w10 = tx.w_first * wy1, w11 = tx.w_second * wy1;
        const uint8_t* a = upper + tx.first;
        const uint8_t* b = upper + tx.second;
        const uint8_t* c = lower + tx.first;
        const uint8_t* d = lower + tx.second;
        red[u * step] = unit[a[0]] * w00 + unit[b[0]] * w01 + unit[c[0]] * w10 + unit[d[0]] * w11;
        green[u * step] = unit[a[1]] * w00 + unit[b[1]] * w01 + unit[c[1]] * w10 + unit[d[1]] * w11;
        blue[u * step] = unit[a[2]] * w00 + unit[b[2]] * w01 + unit[c[2]] * w10 + unit[d[2]] * w11;
      }
      put_grey(cols.inside_hi, nw);
    }
    if (shifter) shifter->apply(row, nw);
  }
}

int transform_boxes(const std::vector<Box>& in, const Placement& placement, float min_box_pixels,
                    std::vector<Box>& out) {
  int dropped = 0;
  for (const Box& box : in) {
    Box b = placement.to_network(box);
    float x0 = std::clamp(b.x - b.w / 2, 0.0f, 1.0f), x1 = std::clamp(b.x + b.w / 2, 0.0f, 1.0f);
    float y0 = std::clamp(b.y - b.h / 2, 0.0f, 1.0f), y1 = std::clamp(b.y + b.h / 2, 0.0f, 1.0f);
    // Written so that a NaN size is dropped too.
    if (!((x1 - x0) * placement.net_w >= min_box_pixels && (y1 - y0) * placement.net_h >= min_box_pixels)) {
      ++dropped;
      continue;
    }
    b.x = (x0 + x1) / 2;
    b.y = (y0 + y1) / 2;
    b.w = x1 - x0;
    b.h = y1 - y0;
    out.push_back(b);
  }
  return dropped;
}

std::vector<std::pair<int, int>> multiscale_sizes(int base_w, int base_h) {
  // Beyond this no network fits in memory; the bound also keeps the arithmetic in range.
  constexpr int kMaxSide = 1 << 16;
  if (base_w <= 0 || base_h <= 0 || base_w > kMaxSide || base_h > kMaxSide)
    throw Error("multiscale_size: base size " + std::to_string(base_w) + "x" + std::to_string(base_h) +
                " must be positive and at most " + std::to_string(kMaxSide));
  // Multiples of 32 in [base / 1.4, base * 1.4], in integers (base * 5/7 and base * 7/5) so
  // that sizes on the boundary are not lost to rounding.
  int lo = 32 * ((5 * base_w + 7 * 32 - 1) / (7 * 32));
  int hi = 32 * ((7 * base_w) / (5 * 32));
  if (lo > hi) lo = hi = std::max(32, static_cast<int>(std::lround(base_w / 32.0)) * 32);
  std::vector<std::pair<int, int>> sizes;
  for (int width = lo; width <= hi; width += 32) {
    int height = static_cast<int>(std::lround(static_cast<double>(width) * base_h / base_w / 32)) * 32;
    sizes.emplace_back(width, std::max(32, height));
  }
  return sizes;
}

std::pair<int, int> multiscale_size(uint64_t seed, int64_t iteration, int base_w, int base_h, int period) {
  if (period <= 0) throw Error("multiscale_size: period " + std::to_string(period) + " must be positive");
  if (iteration < 0) throw Error("multiscale_size: iteration " + std::to_string(iteration) + " must be >= 0");
  std::vector<std::pair<int, int>> sizes = multiscale_sizes(base_w, base_h);
  KeyedRng rng(seed, static_cast<uint64_t>(iteration / period));
  return sizes[rng.below(sizes.size())];
}

}  // namespace yolo::data
