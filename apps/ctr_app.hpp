#pragma once
// ctr: click prediction on Criteo-format logs (apps/ctr_app.cpp), a built-in app; train_ctr runs it.
#include "runtime/app_registry.hpp"

namespace ps {

app_definition ctr_definition();

}  // namespace ps
