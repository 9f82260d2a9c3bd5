// From a decoded image to the network input: letterbox or stretch to the network size, the
// training augmentations (scale/aspect jitter with crop and translation, horizontal flip,
// hue/saturation/exposure), and the same mapping applied to the boxes. The mapping is kept
// (Placement) so evaluation can undo it and report boxes in original image pixels.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "data/image.h"
#include "data/rng.h"

namespace yolo::data {

enum class ResizeMode { Letterbox, Stretch };
const char* resize_mode_name(ResizeMode mode);      // "letterbox", "stretch"
ResizeMode parse_resize_mode(const std::string& s);  // throws yolo::Error naming the choices

// Continuous pixel coordinates (a pixel i covers [i, i+1)): network = scale * image + offset
// per axis, then mirrored (x -> net_w - x) when flip is set.
struct Placement {
  int image_w = 0, image_h = 0, net_w = 0, net_h = 0;
  float scale_x = 1, scale_y = 1, offset_x = 0, offset_y = 0;
  bool flip = false;
  // Box in normalised original-image coordinates -> normalised network coordinates (unclipped).
  Box to_network(const Box& box) const;
  // The inverse: normalised network coordinates -> normalised original-image coordinates.
  Box to_image(const Box& box) const;
};

// The whole image fitted into the network input: letterbox keeps the aspect ratio (centred,
// bars on two sides), stretch scales each axis to fill.
Placement fit_placement(int image_w, int image_h, int net_w, int net_h, ResizeMode mode);

// Augmentation strengths, as the cfg names them ([net] hue/saturation/exposure, [yolo] jitter).
struct AugmentParams {
  float jitter = 0;        // each crop edge moves by up to jitter * image size, in or out
  float hue = 0;           // hue shift drawn from [-hue, hue], in fractions of the colour circle
  float saturation = 1;    // scale drawn from [1, s], then inverted with probability 1/2
  float exposure = 1;      // same, for the value channel
  bool flip = true;        // horizontal flip with probability 1/2
  float min_box_pixels = 2;  // boxes thinner than this (network pixels) after clipping are dropped
};

struct ColorShift {
  float hue = 0, saturation = 1, exposure = 1;
  bool identity() const { return hue == 0 && saturation == 1 && exposure == 1; }
};

struct Augmentation {
  Placement placement;
  ColorShift color;
};

// Draws one sample's augmentation from `rng` (crop edges, then flip, then colour, always in
// this order, so the result is a function of the rng's key alone).
Augmentation draw_augmentation(int image_w, int image_h, int net_w, int net_h, ResizeMode mode,
                               const AugmentParams& params, KeyedRng& rng);

// Writes the network input, net_h x net_w x 3 floats in [0, 1] (NHWC, RGB): bilinear samples
// of the image through the placement, 0.5 grey where the placement leaves the image, then the
// colour shift (HSV space, clamped).
void render_input(const Image& image, const Placement& placement, const ColorShift& color, float* out);

// Boxes through the placement, clipped to the network input; a box narrower or shorter than
// min_box_pixels after clipping is dropped. Appends to `out`; returns how many were dropped.
int transform_boxes(const std::vector<Box>& in, const Placement& placement, float min_box_pixels,
                    std::vector<Box>& out);

// Multi-scale training ([yolo] random=1): the network size for an iteration, a pure function of
// (seed, iteration / period), so every rank and the prefetcher agree before the batch exists.
// Width drawn uniformly from the multiples of 32 in [base_w / 1.4, base_w * 1.4]; height keeps
// base_h / base_w, rounded to a multiple of 32.
std::pair<int, int> multiscale_size(uint64_t seed, int64_t iteration, int base_w, int base_h, int period = 10);
// Every size multiscale_size can return for this base, widths ascending.
std::vector<std::pair<int, int>> multiscale_sizes(int base_w, int base_h);

}  // namespace yolo::data
