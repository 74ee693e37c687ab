// Package nodee2e is the end-to-end binary that `make conformance` and the
// system tier's TestConformance run (built as e2e.test by ../build.sh):
// upstream's e2e suite (package k8s.io/kubernetes/test/e2e: its
// suite-wide setup and teardown, the framework, the shared node, storage
// and network specs of test/e2e/common, where every [NodeConformance]
// spec lives) without the cluster suites that upstream's own e2e.test
// also links (apps, storage drivers, network, autoscaling, cloud, kubectl,
// ...), none of which has a [NodeConformance] spec. They were about
// 230 of the packages a cold build compiled for e2e.test beyond what the
// test control plane and the kubelet already compile.
//
// The command line is e2e.test's: the framework's common and cluster flags
// (--kubeconfig, --report-dir, --list-images, the --ginkgo.* flags), and
// the e2e config flags. ../../system/conformance_test.go checks that the
// [NodeConformance] specs it lists are the ones the skip list and the CI
// subset name.
package nodee2e

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"k8s.io/component-base/version"
	conformancetestdata "k8s.io/kubernetes/test/conformance/testdata"
	"k8s.io/kubernetes/test/e2e"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"
	testfixtures "k8s.io/kubernetes/test/fixtures"

	// The feature and label constants, frozen before specs are defined.
	_ "k8s.io/kubernetes/test/e2e/feature"
	// The framework's hooks (debug dumps, metrics, node checks), as
	// upstream's e2e.test sets them.
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/utils/format"
)

func TestMain(m *testing.M) {
	showVersion := flag.CommandLine.Bool("version", false, "Displays version information.")
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Get())
		os.Exit(0)
	}
	if flag.CommandLine.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unknown arguments: %v\n", flag.CommandLine.Args())
		os.Exit(1)
	}
	// The manifests and fixtures some specs read, from the binary itself.
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	testfiles.AddFileSource(testfixtures.GetTestFixturesFS())
	testfiles.AddFileSource(conformancetestdata.GetConformanceTestdataFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	if framework.TestContext.RepoRoot != "" {
		testfiles.AddFileSource(testfiles.RootFileSource{Root: framework.TestContext.RepoRoot})
	}
	os.Exit(m.Run())
}

func TestE2E(t *testing.T) {
	e2e.RunE2ETests(t)
}
