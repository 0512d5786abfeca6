#pragma once
// elastic: the load bench_elastic moves shards under (see apps/bench_elastic.cpp).
#include "runtime/app_registry.hpp"

namespace ps {

app_definition elastic_load_definition();

}  // namespace ps
