#pragma once
// rowcheck: the sparse tables' exact-sum check (apps/rowcheck.cpp), a built-in app.
#include "runtime/app_registry.hpp"

namespace ps {

app_definition rowcheck_definition();

}  // namespace ps
