"""Cluster-based isotropy enhancement, CIE (Rajaee & Pilehvar 2021)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import scipy.linalg
from sklearn.cluster import KMeans
from sklearn.metrics import pairwise_distances_argmin

from lmgeom.errors import InputError
from lmgeom.calibrate._base import Calibrator, register


@register
class ClusterIsotropy(Calibrator):
    """Cluster-based isotropy enhancement, CIE (Rajaee & Pilehvar 2021).

    k-means the points; inside each cluster remove the cluster mean and the cluster's top
    `n_components` principal directions. New points use their nearest centroid.

    Parameters
    ----------
    n_clusters : int, default 27
        k, the k-means clusters. `fit` refuses one below 1 or above the number of points
        (`InputError`).
    n_components : int, default 12
        The principal directions removed inside each cluster. A cluster of m points has at most
        m - 1 directions with variance, so it removes min(n_components, number of directions with
        non-zero variance) of them: removing a zero-variance direction would act on new points along
        an arbitrary axis. `fit` refuses one outside [1, d] (`InputError`).
    random_state : int or None, default 0
        The seed of k-means (`sklearn.cluster.KMeans`).

    Attributes
    ----------
    cluster_centers_ : ndarray of shape (k, n_features_in_)
        The k-means centroids, which assign new points to clusters.
    cluster_means_ : ndarray of shape (k, n_features_in_)
        The mean of each cluster's points (zero for an empty cluster).
    components_ : ndarray of shape (k, n_components, n_features_in_)
        Each cluster's removed directions in rows, zero-padded.
    n_components_per_cluster_ : ndarray of shape (k,)
        The directions removed in each cluster.
    cluster_sizes_ : ndarray of shape (k,)
        The points of each cluster.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Names of features seen during fit; defined only when `X` has feature names that are all
        strings.
    """

    collapses_on_few_rows: ClassVar[bool] = True

    _fitted_marker: ClassVar[str] = "components_"

    def __init__(self, n_clusters: int = 27, n_components: int = 12, random_state: int | None = 0) -> None:
        self.n_clusters = n_clusters
        self.n_components = n_components
        self.random_state = random_state

    def fit(self, X: Any, y: Any = None) -> "ClusterIsotropy":
        X, _ = self._validate(X, reset=True)
        self._warn_if_few_rows(*X.shape)
        X = X.astype(np.float64, copy=False)
        n_points, dim = X.shape
        if self.n_clusters < 1 or n_points < self.n_clusters:
            raise InputError(
                f"ClusterIsotropy with n_clusters={self.n_clusters} needs at least that many points, got "
                f"n_samples = {n_points}; lower n_clusters or pass more rows"
            )
        if not 1 <= self.n_components <= dim:
            raise InputError(f"ClusterIsotropy n_components must be between 1 and the dimension {dim}, got {self.n_components}")
        kmeans = KMeans(n_clusters=self.n_clusters, random_state=self.random_state, n_init="auto").fit(X)
        labels = kmeans.labels_
        self.cluster_centers_ = kmeans.cluster_centers_
        self.cluster_means_ = np.zeros((self.n_clusters, dim))
        self.components_ = np.zeros((self.n_clusters, self.n_components, dim))
        self.n_components_per_cluster_ = np.zeros(self.n_clusters, dtype=np.int64)
        self.cluster_sizes_ = np.bincount(labels, minlength=self.n_clusters)
        for cluster in range(self.n_clusters):
            points = X[labels == cluster]
            if len(points) == 0:
                continue
            self.cluster_means_[cluster] = points.mean(axis=0)
            centred = points - self.cluster_means_[cluster]
            directions = _top_directions(centred, self.n_components)
            self.components_[cluster, : len(directions)] = directions
            self.n_components_per_cluster_[cluster] = len(directions)
        return self

    def transform(self, X: Any) -> Any:
        X, restore = self._checked_input(X)
        labels = pairwise_distances_argmin(X, self.cluster_centers_)
        result = np.empty_like(X)
        for cluster in np.unique(labels):
            rows = labels == cluster
            centred = X[rows] - self.cluster_means_[cluster]
            directions = self.components_[cluster, : self.n_components_per_cluster_[cluster]]
            result[rows] = centred - (centred @ directions.T) @ directions
        return restore(result)


def _top_directions(centred: np.ndarray, n_components: int) -> np.ndarray:
    """Up to `n_components` principal directions (rows) of centred points that carry variance."""
    n_points, dim = centred.shape
    if n_points < 2:
        return np.zeros((0, dim))
    # Same non-zero spectrum from the n x n Gram matrix or the d x d scatter: take the smaller one.
    small_cluster = n_points < dim
    gram = centred @ centred.T if small_cluster else centred.T @ centred
    size = gram.shape[0]
    top = min(n_components, size)
    values, vectors = scipy.linalg.eigh(gram, subset_by_index=[size - top, size - 1])
    values, vectors = values[::-1], vectors[:, ::-1]
    tolerance = max(values[0], 0.0) * max(n_points, dim) * np.finfo(np.float64).eps
    keep = int((values > tolerance).sum())
    if small_cluster:  # right singular vectors from left ones: v = X^T u / sigma
        return ((centred.T @ vectors[:, :keep]) / np.sqrt(values[:keep])).T
    return vectors[:, :keep].T
