// The trainer on the 50-digit oracle, compiled once here (oracle/oracle.hpp
// declares these instantiations extern).
#include "oracle/oracle.hpp"
#include "sim/trainer.hpp"

namespace accumcheck {

template class Trainer<Oracle<OracleReal>>;
template class Trainer<Oracle<Tracked<OracleReal>>>;

}  // namespace accumcheck
