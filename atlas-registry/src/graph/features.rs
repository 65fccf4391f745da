//! Which graph features the loaded driver has: each needs entry points that older drivers (or
//! injection libraries that forward only what they know) lack, and a driver of the CUDA release
//! that brought it (SWITCH and IF/ELSE conditional nodes use the entry points of CUDA 12.3, with
//! parameters only CUDA 12.8 drivers take). Asking for a feature gives an error naming every
//! missing entry point, or the release needed and the driver's, before anything is changed.

use crate::driver::calls;
use crate::error::{AtlasError, GraphFeature, Result};

/// `Ok` when the driver has every entry point `feature` needs and is of a CUDA release that has
/// it, else the error naming the entry points it lacks, or the release needed and found.
pub(crate) fn require(feature: GraphFeature) -> Result<()> {
    let missing = match feature {
        GraphFeature::Update => calls::missing_graph_update()?,
        GraphFeature::Conditional | GraphFeature::IfElse | GraphFeature::Switch => {
            calls::missing_conditional()?
        }
    };
    if !missing.is_empty() {
        return Err(AtlasError::GraphFeatureUnavailable { feature, missing });
    }
    let (needs, driver) = (feature.min_cuda(), calls::cuda_version()?);
    if driver < needs {
        return Err(AtlasError::GraphFeatureTooOld {
            feature,
            needs,
            driver,
        });
    }
    Ok(())
}
