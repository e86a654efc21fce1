from benchmarks.containers.kit import serve
from benchmarks.containers.tau2_retail.container import Tau2Retail

if __name__ == "__main__":
    serve(Tau2Retail)
