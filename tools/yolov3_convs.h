// Every distinct [convolutional] shape of models/yolov3.cfg at 416x416, in the order they first
// appear, for the tensor-core benchmark (tools/bench_tc.cu), the planner's table (bench_kernels
// --plans) and the planner's pinned choices (tests/test_kernel_tc_plan.cpp). The heads appear
// twice: with COCO's 255 filters and with the 24 the trainer builds for 3 classes (the synthetic
// shapes set, and the H200 runs of ../shared/gpu-results).
#pragma once

namespace yolo::bench {

struct YoloConv {
  const char* label;  // as bench_conv.cu writes shapes
  int h, w, c_in, c_out, k, stride;
  bool bias;  // the detection heads (no batchnorm) have a bias; the others none
};

// How many layers share each shape, and GFLOP per pass at batch 16, in the comments.
inline constexpr YoloConv kYoloConvs[] = {
    {"416x416 3->32 3x3 s1", 416, 416, 3, 32, 3, 1, false},        // x1   4.8
    {"416->208 32->64 3x3 s2", 416, 416, 32, 64, 3, 2, false},     // x1  25.5
    {"208x208 64->32 1x1 s1", 208, 208, 64, 32, 1, 1, false},      // x1   2.8
    {"208x208 32->64 3x3 s1", 208, 208, 32, 64, 3, 1, false},      // x1  25.5
    {"208->104 64->128 3x3 s2", 208, 208, 64, 128, 3, 2, false},   // x1  25.5
    {"104x104 128->64 1x1 s1", 104, 104, 128, 64, 1, 1, false},    // x2   2.8
    {"104x104 64->128 3x3 s1", 104, 104, 64, 128, 3, 1, false},    // x2  25.5
    {"104->52 128->256 3x3 s2", 104, 104, 128, 256, 3, 2, false},  // x1  25.5
    {"52x52 256->128 1x1 s1", 52, 52, 256, 128, 1, 1, false},      // x10  2.8
    {"52x52 128->256 3x3 s1", 52, 52, 128, 256, 3, 1, false},      // x11 25.5
    {"52->26 256->512 3x3 s2", 52, 52, 256, 512, 3, 2, false},     // x1  25.5
    {"26x26 512->256 1x1 s1", 26, 26, 512, 256, 1, 1, false},      // x10  2.8
    {"26x26 256->512 3x3 s1", 26, 26, 256, 512, 3, 1, false},      // x11 25.5
    {"26->13 512->1024 3x3 s2", 26, 26, 512, 1024, 3, 2, false},   // x1  25.5
    {"13x13 1024->512 1x1 s1", 13, 13, 1024, 512, 1, 1, false},    // x7   2.8
    {"13x13 512->1024 3x3 s1", 13, 13, 512, 1024, 3, 1, false},    // x7  25.5
    {"13x13 1024->255 1x1 s1", 13, 13, 1024, 255, 1, 1, true},     // x1   1.4 (head)
    {"13x13 512->256 1x1 s1", 13, 13, 512, 256, 1, 1, false},      // x1   0.7
    {"26x26 768->256 1x1 s1", 26, 26, 768, 256, 1, 1, false},      // x1   4.3
    {"26x26 512->255 1x1 s1", 26, 26, 512, 255, 1, 1, true},       // x1   2.8 (head)
    {"26x26 256->128 1x1 s1", 26, 26, 256, 128, 1, 1, false},      // x1   0.7
    {"52x52 384->128 1x1 s1", 52, 52, 384, 128, 1, 1, false},      // x1   4.3
    {"52x52 256->255 1x1 s1", 52, 52, 256, 255, 1, 1, true},       // x1   5.6 (head)
    {"13x13 1024->24 1x1 s1", 13, 13, 1024, 24, 1, 1, true},       // x1   0.1 (head, 3 classes)
    {"26x26 512->24 1x1 s1", 26, 26, 512, 24, 1, 1, true},         // x1   0.3 (head, 3 classes)
    {"52x52 256->24 1x1 s1", 52, 52, 256, 24, 1, 1, true},         // x1   0.5 (head, 3 classes)
};

}  // namespace yolo::bench
