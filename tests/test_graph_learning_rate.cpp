// The learning-rate schedule (graph/learning_rate.h) against darknet's formulas (network.c,
// get_current_rate) written out here at chosen iterations, each policy; random's draws are the
// same for a (seed, iteration) whoever asks and look uniform.
#include <doctest/doctest.h>

#include <cmath>
#include <set>

#include "graph/learning_rate.h"

using namespace yolo::graph;
using Policy = NetParams::Policy;

namespace {

NetParams with(Policy policy) {
  NetParams net;
  net.learning_rate = 0.001f;
  net.policy = policy;
  return net;
}

}  // namespace

TEST_CASE("learning rate: burn-in lr*(i/burn_in)^power (4 by default, or the cfg's), then the steps policy") {
  NetParams net = with(Policy::Steps);
  net.burn_in = 100;
  net.steps = {400, 450};
  net.scales = {0.1f, 0.1f};
  CHECK(learning_rate_at(net, 0) == 0.0f);
  CHECK(learning_rate_at(net, 50) == doctest::Approx(0.001 * 0.0625));
  CHECK(learning_rate_at(net, 100) == doctest::Approx(0.001));
  CHECK(learning_rate_at(net, 399) == doctest::Approx(0.001));
  CHECK(learning_rate_at(net, 400) == doctest::Approx(0.0001));
  CHECK(learning_rate_at(net, 450) == doctest::Approx(0.00001));
  net.power = 2;
  CHECK(learning_rate_at(net, 50) == doctest::Approx(0.001 * 0.25));
}

TEST_CASE("learning rate: step, exp, poly and sigmoid as darknet computes them") {
  NetParams step = with(Policy::Step);
  step.step = 300;
  step.scale = 0.5f;
  for (int i : {0, 299, 300, 899, 900, 4000})
    CHECK(learning_rate_at(step, i) == doctest::Approx(0.001 * std::pow(0.5, i / 300)));

  NetParams exp = with(Policy::Exp);
  exp.gamma = 0.999f;
  for (int i : {0, 1, 1000, 5000}) CHECK(learning_rate_at(exp, i) == doctest::Approx(0.001 * std::pow(0.999, i)));

  NetParams poly = with(Policy::Poly);
  poly.power = 4;
  poly.max_batches = 800000;
  for (int i : {0, 1, 400000, 799999})
    CHECK(learning_rate_at(poly, i) == doctest::Approx(0.001 * std::pow(1.0 - i / 800000.0, 4)).epsilon(1e-5));
  CHECK(learning_rate_at(poly, 800000) == 0.0f);
  CHECK(learning_rate_at(poly, 900000) == 0.0f);  // past the end: 0, not (negative)^power

  NetParams sig = with(Policy::Sigmoid);
  sig.gamma = 0.01f;
  sig.step = 1000;
  for (int i : {0, 500, 1000, 1500, 3000})
    CHECK(learning_rate_at(sig, i) == doctest::Approx(0.001 / (1 + std::exp(0.01 * (i - 1000)))));
  CHECK(learning_rate_at(sig, 1000) == doctest::Approx(0.0005));

  CHECK(learning_rate_at(with(Policy::Constant), 12345) == 0.001f);
}

TEST_CASE("learning rate: random is lr*u^power with u a function of (seed, iteration): the same on every rank") {
  NetParams net = with(Policy::Random);
  net.power = 1;
  double sum = 0;
  std::set<float> distinct;
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    const float rate = learning_rate_at(net, i, 7);
    CHECK(rate == learning_rate_at(net, i, 7));  // asked again (another rank, a resumed run)
    CHECK(rate >= 0.0f);
    CHECK(rate < 0.001f);
    sum += rate / 0.001;
    distinct.insert(rate);
  }
  CHECK(sum / n == doctest::Approx(0.5).epsilon(0.05));  // E[u] = 1/2
  CHECK(distinct.size() > n * 9 / 10);
  int same = 0;
  for (int i = 0; i < 100; ++i) same += learning_rate_at(net, i, 7) == learning_rate_at(net, i, 8);
  CHECK(same < 5);  // another seed, other draws
  net.power = 4;    // E[u^4] = 1/5
  sum = 0;
  for (int i = 0; i < n; ++i) sum += learning_rate_at(net, i, 7) / 0.001;
  CHECK(sum / n == doctest::Approx(0.2).epsilon(0.1));
}
